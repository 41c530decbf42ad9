"""The lookahead that also knows which GPU models are scarce for the pods that can run only on them.

Replayed on the openb traces with model-constrained pods, both ``fgd`` and ``fgd-lookahead`` lose most of
their unallocated GPU to constrained pods that fail while a fifth of the G2 GPUs are still free: pods that
could run anywhere took the P100, V100, G3 and T4 GPUs first. Fragmentation cannot see this: a flexible pod
on a P100 card shrinks the idle memory and the memory P100-only tasks can use by the same amount, so F does
not move. What was lost is capacity that some demand has no alternative to.

The pressure on a model g is the share of g's capacity that the demand constrained to it will claim:
for every shape m of the learned workload whose model rule excludes part of the cluster, its share of GPU
demand q_m divided by the cluster share c(S_m) of the models it accepts, summed over the shapes that accept
g, at most 1. A flexible pod that takes u units of g then strands, near full load, about pressure(g) x u
units of constrained demand, so placement pays that on top of the growth of F: in the same unit, since a
stranded unit of constrained demand is as unallocated as a fragmented one. A pod that can run only on g pays
the same everywhere it can go, so its choice is unchanged; a pod accepting several models goes to the one
least pressed. Without constrained demand the pressure is zero and the policy is ``fgd-lookahead``.

Both facts are learned or known at the time: the demand from the pods seen (the whole decayed histogram, since
constrained shapes are many and small; the lookahead's target is the whole histogram too, see ``__init__``),
the capacity per model from the cluster's nodes (``observe_inventory``, fed by the caller: the extender's
node cache, the replay's node list).
"""

from __future__ import annotations

from collections.abc import Mapping

from gpushare.model import Node
from gpushare.policies.fgd import PRECISION
from gpushare.policies.lookahead import FragmentationLookahead
from gpushare.policies.workload import Shape, WorkloadDistribution


def model_pressure(histogram: Mapping[Shape, float], capacity: Mapping[str, int]) -> dict[str, float]:
    """Pressure per model (see the module docstring) for a histogram of shape -> probability."""
    total_capacity = sum(capacity.values())
    demand: list[tuple[float, frozenset[str]]] = []
    for shape, probability in histogram.items():
        if shape.gpu_count == 0:
            continue
        accepted = frozenset(m for m in capacity if shape.models.accepts(m))
        demand.append((probability * shape.gpu_count * shape.per_gpu, accepted))
    total_demand = sum(d for d, _ in demand)
    pressure = dict.fromkeys(capacity, 0.0)
    if total_capacity <= 0 or total_demand <= 0:
        return pressure
    for amount, accepted in demand:
        supply = sum(capacity[m] for m in accepted)
        if supply <= 0 or len(accepted) == len(capacity):
            continue
        claim = amount / total_demand / (supply / total_capacity)
        for model in accepted:
            pressure[model] += claim
    return {m: min(p, 1.0) for m, p in pressure.items()}


WHOLE_WORKLOAD = 1.0


class ScarcityLookahead(FragmentationLookahead):
    """``fgd-lookahead`` plus the cost of taking capacity of a model that constrained demand needs."""

    name = "fgd-scarcity"

    def __init__(self, workload: WorkloadDistribution | None = None) -> None:
        # Every learned shape, not the most frequent 95%: the rare large ones (eight GPUs and 120 cores) are
        # the ones whose room the lookahead must keep, and the first to fail when it does not count them.
        super().__init__(workload if workload is not None else WorkloadDistribution(coverage=WHOLE_WORKLOAD))
        self._capacity: dict[str, int] = {}
        self._pressure: dict[str, float] = {}
        self._basis: tuple[int, int] = (-1, 0)
        self._inventory_version = 0
        self._version = 0

    def observe_inventory(self, capacity: Mapping[str, int]) -> None:
        """The cluster's GPU capacity per model, in memory units (healthy GPUs)."""
        if dict(capacity) != self._capacity:
            self._capacity = dict(capacity)
            self._inventory_version += 1

    @property
    def version(self) -> int:
        self._refresh()
        return self._version

    def _refresh(self) -> None:
        basis = (self.workload.version, self._inventory_version)
        if basis != self._basis:
            self._basis = basis
            self._pressure = model_pressure(self.workload.histogram(), self._capacity)
            self._version += 1

    def displacement(self, node: Node, taken: dict[int, int]) -> int:
        if not taken:
            return 0
        self._refresh()
        cost = 0.0
        for gpu in node.gpus:
            units = taken.get(gpu.index)
            if units:
                cost += units * self._pressure.get(gpu.model, 0.0)
        return round(cost * PRECISION)


