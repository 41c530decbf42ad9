"""Kubernetes resource quantities ("500m", "4Gi", "2"): parsing, the API server's canonical form, integers.

The core may not import the kubernetes client, so it carries its own parser. It follows the API server's
(apimachinery ``resource.ParseQuantity``), not only the documented grammar, because the local cluster must
accept and reject exactly what a real API server does:

- a hand-written scanner (sign, digits, optional fraction, suffix letters, optional signed digits), which
  is stricter than nothing and looser than the regular expression quoted in its error (``"+"`` and ``"."``
  are zero);
- suffixes ``n u m "" k M G T P E`` (decimal), ``Ki Mi Gi Ti Pi Ei`` (binary) and ``e<int>``/``E<int>``
  exponents, whose value must fit an int64 and is then truncated to 32 bits as Go's ``int32()`` does;
- non-zero values are rounded away from zero to a multiple of 10^-9; binary quantities are capped at
  2^63-1 in magnitude, decimal ones are not capped at all (``1e1000000`` is a valid quantity).

Every step works on the digits of the input and an exponent, never on an expanded number, so any string
parses in time linear in its length. Integers for callers (``to_int``, ``to_milli``, ``to_mib``) are
bounded to the int64 range that every Kubernetes component counts in; beyond it they raise QuantityError.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from decimal import MAX_EMAX, MIN_EMIN, ROUND_UP, Context, Decimal
from typing import NamedTuple

GRAMMAR = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
FORMAT_WRONG = f"quantities must match the regular expression '{GRAMMAR}'"
SUFFIX_WRONG = "unable to parse quantity's suffix"
INT64_MAX = 2**63 - 1

_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_BY_EXPONENT = {e: s for s, e in _DECIMAL_SUFFIXES.items()}
_BINARY_SUFFIXES = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_BINARY_BY_EXPONENT = {e: s for s, e in _BINARY_SUFFIXES.items()}
_SUFFIX_LETTERS = frozenset("eEinumkKMGTP")
_DIGITS = frozenset("0123456789")
_NANO = Decimal("1e-9")

DECIMAL_SI = "DecimalSI"
BINARY_SI = "BinarySI"
DECIMAL_EXPONENT = "DecimalExponent"


class QuantityError(ValueError):
    """A resource quantity that Kubernetes would not accept, or one too large to count with."""


class Quantity(NamedTuple):
    """A parsed quantity: its exact value, the format it was written in, and how the API server writes it."""

    value: Decimal
    format: str
    canonical: str


def _exact(digits: int) -> Context:
    """A context in which arithmetic on numbers of about ``digits`` digits is exact, whatever their exponent."""
    return Context(prec=digits + 40, Emax=MAX_EMAX, Emin=MIN_EMIN)


def _scan(text: str) -> tuple[bool, str, str, str]:
    """Split a quantity into sign, integer digits, fraction digits and suffix, as the API server's scanner does."""
    end = len(text)
    pos = 0
    positive = True
    if end and text[0] in "+-":
        positive = text[0] == "+"
        pos = 1
    while pos < end and text[pos] == "0":
        pos += 1
    if pos >= end:
        return positive, "0", "", ""
    start = pos
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    num = text[start:pos] or "0"
    denom = ""
    if pos < end and text[pos] == ".":
        pos += 1
        start = pos
        while pos < end and text[pos] in _DIGITS:
            pos += 1
        denom = text[start:pos]
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_LETTERS:
        pos += 1
    if pos < end and text[pos] in "+-":
        pos += 1
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    if pos < end:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity such as '2', '500m' or '4Gi': {FORMAT_WRONG}")
    return positive, num, denom, text[suffix_start:]


def _go_int64(text: str) -> int | None:
    """Go's ``strconv.ParseInt(text, 10, 64)``: an optional sign and ASCII digits within the int64 range."""
    body = text[1:] if text[:1] in ("+", "-") else text
    if not body or any(c not in _DIGITS for c in body):
        return None
    body = body.lstrip("0") or "0"
    if len(body) > 19:
        return None
    value = -int(body) if text[:1] == "-" else int(body)
    return value if -(2**63) <= value <= INT64_MAX else None


def _interpret(suffix: str, original: str) -> tuple[int, int, str]:
    """The base, exponent and format a suffix stands for."""
    if suffix in _DECIMAL_SUFFIXES:
        return 10, _DECIMAL_SUFFIXES[suffix], DECIMAL_SI
    if suffix in _BINARY_SUFFIXES:
        return 2, _BINARY_SUFFIXES[suffix], BINARY_SI
    if len(suffix) > 1 and suffix[0] in "eE":
        parsed = _go_int64(suffix[1:])
        if parsed is not None:
            # The API server keeps the exponent in an int32, truncating it the way Go's int32() does; mirrored
            # so that the local cluster reads "1e4294967297" as the 10 a real server stores.
            return 10, (parsed + 2**31) % 2**32 - 2**31, DECIMAL_EXPONENT
    raise QuantityError(f"{original!r} is not a Kubernetes quantity such as '2', '500m' or '4Gi': {SUFFIX_WRONG} "
                        f"{suffix!r} (use n, u, m, k, M, G, T, P, E, Ki, Mi, Gi, Ti, Pi, Ei or an exponent like e3)")


def _keeps_text(fmt: str, exponent: int, num: str, denom: str) -> bool:
    """Whether the API server stores the text as written: only in its int64 fast path, and only when that
    text already looks canonical by its (rough) test."""
    if fmt == BINARY_SI:
        if denom:
            return False
        scale = 0
        precision = 14 - len(num) - exponent * 3 // 10
        multiplier = 1 << exponent
    else:
        scale = exponent - len(denom)
        precision = 18 - len(num) - len(denom)
        multiplier = 1
    if precision < 0 or scale < -9:
        return False
    shifted = num + denom
    if int(shifted) * multiplier > INT64_MAX:
        return False
    if fmt == BINARY_SI:
        return int(shifted) & 7 != 0
    return scale % 3 == 0 and not shifted.endswith("000") and shifted[0] != "0"


def _round_to_nano(value: Decimal, digits: int) -> Decimal:
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int)
    if value == 0 or exponent >= -9:
        return value
    return value.quantize(_NANO, rounding=ROUND_UP, context=_exact(digits))


def _strip_tens(value: Decimal) -> tuple[str, int]:
    """The digits of |value| without trailing zeros, and the power of ten they are scaled by."""
    _, digit_tuple, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    digits = "".join(map(str, digit_tuple)).lstrip("0") or "0"
    stripped = digits.rstrip("0") or "0"
    return stripped, exponent + len(digits) - len(stripped)


def _canonical(value: Decimal, fmt: str) -> str:
    """How the API server writes a quantity back: no fraction, the largest exponent (a multiple of 3, or a
    power of 1024 for binary quantities that are whole and at least 1024 in magnitude)."""
    if value == 0:
        return "0"
    sign = "-" if value < 0 else ""
    if fmt == BINARY_SI:
        if abs(value) < 1024 or value != value.to_integral_value(rounding=ROUND_UP, context=_exact(20)):
            fmt = DECIMAL_SI
        else:
            amount, power = int(abs(value)), 0
            while amount % 1024 == 0:
                amount //= 1024
                power += 10
            return f"{sign}{amount}{_BINARY_BY_EXPONENT.get(power, '')}"
    digits, exponent = _strip_tens(value)
    down = exponent % 3
    digits += "0" * down
    exponent -= down
    if fmt == DECIMAL_EXPONENT:
        return f"{sign}{digits}e{exponent}" if exponent else f"{sign}{digits}"
    # A decimal exponent beyond E (10^18) has no suffix, and the API server then writes none at all: "1000E"
    # comes back as "1". Mirrored, as it is what clients of a real server read.
    return f"{sign}{digits}{_DECIMAL_BY_EXPONENT.get(exponent, '')}"


def quantity(text: str | int | float) -> Quantity:
    """Parse a quantity as the API server does; raise QuantityError with its reason if it would reject it."""
    if isinstance(text, int | float):
        text = str(text)
    raw = text.strip()  # the API server trims whitespace around a quantity before parsing it
    if not raw:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity such as '2', '500m' or '4Gi': {FORMAT_WRONG}")
    if raw == "0":
        return Quantity(Decimal(0), DECIMAL_SI, "0")
    positive, num, denom, suffix = _scan(raw)
    base, exponent, fmt = _interpret(suffix, text)
    sign = "" if positive else "-"
    digits = len(num) + len(denom)
    keep = _keeps_text(fmt, exponent, num, denom)
    if base == 10:
        value = Decimal(f"{sign}{num}{denom}E{exponent - len(denom)}")
    else:
        value = Decimal(f"{sign}{num}{denom}E{-len(denom)}").fma(2**exponent, 0, context=_exact(digits + 20))
    value = _round_to_nano(value, digits + 20)
    if fmt == BINARY_SI:
        if abs(value) > INT64_MAX:
            value = Decimal(INT64_MAX).copy_sign(value)
        if 0 < abs(value) < 1:
            fmt = DECIMAL_SI
    return Quantity(value, fmt, raw if keep else _canonical(value, fmt))


def parse_quantity(text: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity into its exact decimal value (as the API server rounds it)."""
    return quantity(text).value


def canonical(text: str | int | float) -> str:
    """The quantity as a real API server stores and returns it (``"1000m"`` -> ``"1"``, ``"1.5Gi"`` -> ``"1536Mi"``)."""
    return quantity(text).canonical


# Pods repeat a handful of quantities ("1", "500m", "2Gi"), and each is read at every watch event, filter and bind:
# the answers are remembered (``typed``: True must still be refused, even after 1 was read).
@functools.lru_cache(maxsize=4096, typed=True)
def _scaled(text: str | int | float, numerator: int, denominator: int) -> int:
    """ceil(value * numerator / denominator), within the int64 range Kubernetes components count in."""
    value = parse_quantity(text)
    if value.adjusted() > 40:
        raise QuantityError(f"{text!r} is too large to count with: Kubernetes components count resources in "
                            f"64-bit integers, up to {INT64_MAX}.")
    nanos = int(value.scaleb(9, context=_exact(60)))  # exact: values are multiples of 10^-9
    top, bottom = nanos * numerator, 10**9 * denominator
    result = -(-top // bottom)
    if abs(result) > INT64_MAX:
        raise QuantityError(f"{text!r} is too large to count with: Kubernetes components count resources in "
                            f"64-bit integers, up to {INT64_MAX}.")
    return result


def to_int(text: str | int | float) -> int:
    """Whole units, rounded up as the scheduler does for requests."""
    return _scaled(text, 1, 1)


def to_milli(text: str | int | float) -> int:
    """Thousandths of a unit (CPU millicores)."""
    return _scaled(text, 1000, 1)


def to_mib(text: str | int | float) -> int:
    """Bytes expressed in MiB, rounded up."""
    return _scaled(text, 1, 2**20)


def capacity_amount(values: Mapping[str, object], resource: str) -> int:
    """A node's capacity or allocatable of ``resource`` as ``host_amount`` counts it; 0 when absent or unreadable.

    Node status comes from the kubelet through the API server, which validated it; 0 only keeps a broken
    object from taking the reader down with it.
    """
    raw = values.get(resource)
    if raw is None:
        return 0
    try:
        return host_amount(resource, str(raw))
    except QuantityError:
        return 0


def host_amount(resource: str, text: str | int | float) -> int:
    """A host resource as the scheduler counts it: CPU in millicores, memory in MiB, anything else in units."""
    if resource == "cpu":
        return to_milli(text)
    if resource == "memory":
        return to_mib(text)
    return to_int(text)
