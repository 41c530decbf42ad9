"""The one quantity parser: the API server's grammar, range and canonical form, in bounded time for any input."""

from __future__ import annotations

import re
import time
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.quantity import GRAMMAR, QuantityError, canonical, parse_quantity, quantity, to_int, to_mib, to_milli

# (written, value, how the API server writes it back) -- values and forms follow apimachinery's ParseQuantity
# and CanonicalizeBytes.
CASES = [
    ("1", Decimal(1), "1"),
    ("1000", Decimal(1000), "1k"),
    ("1000m", Decimal(1), "1"),
    ("1.5", Decimal("1.5"), "1500m"),
    ("0.5", Decimal("0.5"), "500m"),
    ("1.5Gi", Decimal(1536 * 2**20), "1536Mi"),
    ("1024Ki", Decimal(2**20), "1Mi"),
    ("0.5Ki", Decimal(512), "512"),
    ("1.1Ki", Decimal("1126.4"), "1126400m"),
    ("1e3", Decimal(1000), "1e3"),
    ("1.5e3", Decimal(1500), "1500"),
    ("1e1000000", Decimal("1e1000000"), "10e999999"),  # decimal quantities have no upper bound
    ("1e-1000000", Decimal("1e-9"), "1e-9"),  # non-zero values round up to 1n
    ("0.5n", Decimal("1e-9"), "1n"),
    ("-0.5n", Decimal("-1e-9"), "-1n"),
    ("16Ei", Decimal(2**63 - 1), "9223372036854775807"),  # binary quantities are capped at 2^63-1
    ("1e4294967297", Decimal(10), "10"),  # the exponent is truncated to 32 bits, as Go's int32() does
    ("1000E", Decimal("1e21"), "1"),  # no suffix exists beyond E, and the API server then writes none
    ("+1", Decimal(1), "+1"),  # already canonical by the API server's test: kept as written
    ("Ki", Decimal(0), "0"),  # the scanner lets the number be empty
    (".", Decimal(0), "0"),
    (" 2 ", Decimal(2), "2"),
    (3, Decimal(3), "3"),
    (1.5, Decimal("1.5"), "1500m"),
]


@pytest.mark.parametrize(("text", "value", "written"), CASES)
def test_values_and_canonical_forms_are_the_api_servers(text: str | float, value: Decimal, written: str) -> None:
    assert parse_quantity(text) == value
    assert canonical(text) == written


@pytest.mark.parametrize(("text", "reason"), [
    ("abc", "quantities must match the regular expression"),
    ("4.5.1", "quantities must match the regular expression"),
    ("", "quantities must match the regular expression"),
    ("1e", "unable to parse quantity's suffix"),
    ("1Kii", "unable to parse quantity's suffix"),
    ("1e99999999999999999999", "unable to parse quantity's suffix"),  # the exponent must fit an int64
])
def test_what_the_api_server_rejects_is_rejected_with_its_reason(text: str, reason: str) -> None:
    with pytest.raises(QuantityError, match=re.escape(reason)):
        quantity(text)


def test_integers_stay_within_what_kubernetes_counts_in() -> None:
    assert (to_int("1.5"), to_milli("1.5"), to_mib("1.5Gi")) == (2, 1500, 1536)
    with pytest.raises(QuantityError, match="too large to count with"):
        to_int("1e1000000")
    with pytest.raises(QuantityError, match="too large to count with"):
        to_milli("9223372036854775807")


_SUFFIX = st.sampled_from(["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
                           "e3", "E-2", "e+7", "e-12", "e1000000"])
_VALID = st.builds(lambda sign, whole, frac, suffix: f"{sign}{whole}{frac}{suffix}",
                   st.sampled_from(["", "+", "-"]), st.from_regex(r"[0-9]{1,30}", fullmatch=True),
                   st.one_of(st.just(""), st.from_regex(r"\.[0-9]{0,30}", fullmatch=True)), _SUFFIX)


@given(st.text(alphabet="0123456789.+-eEinumkKMGTP xy", max_size=400) | st.text(max_size=200))
@settings(max_examples=400, deadline=None)
def test_any_string_parses_quickly_and_only_if_the_grammar_allows_it(text: str) -> None:
    started = time.perf_counter()
    try:
        quantity(text)
    except QuantityError:
        pass
    else:
        # The regular expression is looser than the API server's scanner (it allows "1..2"), except that the
        # scanner lets the number be empty: "+", "Ki" and "E" are zero on a real server too.
        assert re.fullmatch(GRAMMAR.strip("^$").replace("]+)", "]*)"), text.strip())
    assert time.perf_counter() - started < 0.05


@given(_VALID)
@settings(max_examples=400, deadline=None)
def test_the_canonical_form_is_a_fixed_point_with_the_same_value(text: str) -> None:
    parsed = quantity(text)
    again = quantity(parsed.canonical)
    assert again.canonical == parsed.canonical
    if parsed.value == 0 or abs(parsed.value.adjusted()) <= 18:  # "1000E" loses its value, as on a real server
        assert again.value == parsed.value


@pytest.mark.parametrize("size", [100_000, 1_000_000])
def test_huge_inputs_parse_in_linear_time(size: int) -> None:
    started = time.perf_counter()
    assert canonical("1" * size + "e-99999999")
    with pytest.raises(QuantityError):
        quantity("0" * size + "x")
    assert time.perf_counter() - started < 2.0
