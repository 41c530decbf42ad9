"""Policies by name, as the extender flag and the per-pod annotation spell them."""

from __future__ import annotations

from collections.abc import Callable

from gpushare.policies.base import Policy
from gpushare.policies.fgd import FragmentationGradient
from gpushare.policies.lookahead import FragmentationLookahead
from gpushare.policies.scarcity import ScarcityLookahead
from gpushare.policies.simple import Binpack, Spread
from gpushare.policies.workload import WorkloadDistribution

DEFAULT_POLICY = "fgd-scarcity"

# Each factory receives the workload distribution the policy should learn from (or None for a fresh one).
_FACTORIES: dict[str, Callable[[WorkloadDistribution | None], Policy]] = {
    "binpack": lambda _: Binpack(),
    "spread": lambda _: Spread(),
    "fgd": FragmentationGradient,
    "fgd-lookahead": FragmentationLookahead,
    "fgd-scarcity": ScarcityLookahead,
}


def policy_names() -> tuple[str, ...]:
    return tuple(_FACTORIES)


def make_policy(name: str, workload: WorkloadDistribution | None = None) -> Policy:
    """A fresh policy; ``workload`` seeds those that model the workload (others ignore it)."""
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise ValueError(f"Unknown placement policy {name!r}; choose one of {', '.join(_FACTORIES)}.") from None
    return factory(workload)
