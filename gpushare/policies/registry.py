"""Policies by name, as the extender flag and the per-pod annotation spell them."""

from __future__ import annotations

from collections.abc import Callable

from gpushare.policies.base import Policy
from gpushare.policies.simple import Binpack, Spread

DEFAULT_POLICY = "binpack"

_FACTORIES: dict[str, Callable[[], Policy]] = {
    "binpack": Binpack,
    "spread": Spread,
}


def policy_names() -> tuple[str, ...]:
    return tuple(_FACTORIES)


def make_policy(name: str) -> Policy:
    try:
        return _FACTORIES[name]()
    except KeyError:
        raise ValueError(f"Unknown placement policy {name!r}; choose one of {', '.join(_FACTORIES)}.") from None
