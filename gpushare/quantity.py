"""Kubernetes resource quantities ("500m", "4Gi", "2") as integers.

The core may not import the kubernetes client, so it carries its own small parser of the documented
quantity grammar (decimal and binary SI suffixes, exponents).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import ROUND_CEILING, Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
            "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"), "T": Decimal("1e12"),
            "P": Decimal("1e15"), "E": Decimal("1e18")}


class QuantityError(ValueError):
    """A resource quantity that Kubernetes would not accept."""


def parse_quantity(text: str | int | float) -> Decimal:
    """Parse a Kubernetes quantity into its exact decimal value."""
    if isinstance(text, int | float):
        return Decimal(str(text))
    raw = text.strip()
    for suffix, factor in _BINARY.items():
        if raw.endswith(suffix):
            return _number(raw[: -len(suffix)], text) * factor
    if raw[-1:] in _DECIMAL and not raw[-1:].isdigit():
        return _number(raw[:-1], text) * _DECIMAL[raw[-1]]
    return _number(raw, text)


def _number(digits: str, original: str) -> Decimal:
    try:
        value = Decimal(digits)
    except InvalidOperation:
        raise QuantityError(f"{original!r} is not a Kubernetes quantity such as '2', '500m' or '4Gi'.") from None
    if not value.is_finite():
        raise QuantityError(f"{original!r} is not a finite Kubernetes quantity.")
    return value


def to_int(text: str | int | float) -> int:
    """Whole units, rounded up as the scheduler does for requests."""
    return int(parse_quantity(text).to_integral_value(rounding=ROUND_CEILING))


def to_milli(text: str | int | float) -> int:
    """Thousandths of a unit (CPU millicores)."""
    return int((parse_quantity(text) * 1000).to_integral_value(rounding=ROUND_CEILING))


def to_mib(text: str | int | float) -> int:
    """Bytes expressed in MiB, rounded up."""
    return int((parse_quantity(text) / 2**20).to_integral_value(rounding=ROUND_CEILING))


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
