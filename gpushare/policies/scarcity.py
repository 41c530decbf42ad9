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

Both facts are learned or known at the time: the demand from the pods seen (the same decayed histogram as
the target workload, all of it rather than the 95% target, since constrained shapes are many and small),
the capacity per model from the cluster's nodes (``observe_inventory``, fed by the caller: the extender's
node cache, the replay's node list).
"""

from __future__ import annotations

from collections.abc import Mapping

from gpushare.contract import PodRequest
from gpushare.model import Node, NodeClass
from gpushare.policies.fgd import PRECISION
from gpushare.policies.lookahead import FragmentationLookahead
from gpushare.policies.workload import Shape, WorkloadDistribution

# A shape counts as restricted by node size when the nodes it fits hold at most this share of the capacity of
# its models. Charging the 8-GPU shapes that fit most 8-GPU nodes (79% of the openb cluster) kept whole nodes
# whole at the cost of everything else (multigpu20: 3.91 -> 4.38 unallocated, seeds 42-43); shapes confined to
# a minority of nodes (the 120-core 8-GPU pods that fit only the 39 G3 nodes) are the ones worth keeping room for.
SCARCE_SHARE = 0.5


def _fits_empty(shape: Shape, node: NodeClass) -> bool:
    cpu, gpus = node
    room = sum(1 for model, total in gpus if total >= shape.per_gpu and shape.models.accepts(model))
    return room >= shape.gpu_count and not (cpu and shape.cpu_milli > cpu)


def size_pressure(histogram: Mapping[Shape, float], capacity: Mapping[str, int],
                  classes: Mapping[NodeClass, int]) -> dict[Shape, float]:
    """Pressure per GPU shape that fits on fewer nodes than its models allow (too few GPUs or too few cores
    on the others): its share of GPU demand over the cluster share of the nodes it fits on, less the same over
    the share of its models, so that only the scarcity beyond the models' (``model_pressure``) is counted."""
    total_capacity = sum(capacity.values())
    demand = {s: p * s.gpu_count * s.per_gpu for s, p in histogram.items() if s.gpu_count}
    total_demand = sum(demand.values())
    pressure: dict[Shape, float] = {}
    if total_capacity <= 0 or total_demand <= 0:
        return pressure
    for shape, amount in demand.items():
        allowed = sum(capacity[m] for m in capacity if shape.models.accepts(m))
        fits = sum(count * sum(total for model, total in gpus if shape.models.accepts(model))
                   for (cpu, gpus), count in classes.items() if _fits_empty(shape, (cpu, gpus)))
        # Only shapes that fit on at most half of what their models allow: see SCARCE_SHARE.
        if 0 < fits <= allowed * SCARCE_SHARE:
            share = amount / total_demand
            pressure[shape] = min(share * total_capacity / fits - share * total_capacity / allowed, 1.0)
    return pressure


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


class ScarcityLookahead(FragmentationLookahead):
    """``fgd-lookahead`` plus the cost of taking capacity of a model that constrained demand needs."""

    name = "fgd-scarcity"

    def __init__(self, workload: WorkloadDistribution | None = None) -> None:
        super().__init__(workload)
        self._capacity: dict[str, int] = {}
        self._pressure: dict[str, float] = {}
        self._classes: dict[NodeClass, int] = {}
        # The size-restricted shapes whose lost copies are worth charging, with their pressure.
        self._restricted: tuple[tuple[Shape, float], ...] = ()
        self._basis: tuple[int, int] = (-1, 0)
        self._inventory_version = 0
        self._version = 0

    def observe_inventory(self, capacity: Mapping[str, int], classes: Mapping[NodeClass, int]) -> None:
        """The cluster's GPU capacity per model, in memory units (healthy GPUs), and its nodes per class."""
        if dict(capacity) != self._capacity or dict(classes) != self._classes:
            self._capacity = dict(capacity)
            self._classes = dict(classes)
            self._inventory_version += 1

    @property
    def version(self) -> int:
        self._refresh()
        return self._version

    def _refresh(self) -> None:
        basis = (self.workload.version, self._inventory_version)
        if basis != self._basis:
            self._basis = basis
            histogram = self.workload.histogram()
            self._pressure = model_pressure(histogram, self._capacity)
            # A shape whose lost copy would cost less than half the lookahead's step changes no decision.
            half_step = self._step() / PRECISION / 2
            self._restricted = tuple((shape, pressure) for shape, pressure in
                                     size_pressure(histogram, self._capacity, self._classes).items()
                                     if pressure * shape.gpu_count * shape.per_gpu >= half_step)
            self._version += 1

    def displacement(self, node: Node, request: PodRequest, taken: dict[int, int]) -> int:
        self._refresh()
        cost = 0.0
        for gpu in node.gpus:
            units = taken.get(gpu.index)
            if units:
                cost += units * self._pressure.get(gpu.model, 0.0)
        if self._restricted:
            cpu_free = node.cpu_milli - node.cpu_used if node.cpu_milli else None
            before = [(g.model, g.free, g.used == 0 and g.holders == 0 and g.free >= g.total) for g in node.gpus
                      if g.healthy]
            after = [(model, free - taken.get(g.index, 0), whole and g.index not in taken)
                     for g, (model, free, whole) in zip((g for g in node.gpus if g.healthy), before, strict=True)]
            cpu_after = None if cpu_free is None else cpu_free - request.cpu_milli
            for shape, pressure in self._restricted:
                lost = _copies(shape, before, cpu_free) - _copies(shape, after, cpu_after)
                if lost:
                    cost += pressure * lost * shape.gpu_count * shape.per_gpu
        return round(cost * PRECISION)


def _copies(shape: Shape, gpus: list[tuple[str, int, bool]], cpu_free: int | None) -> int:
    """How many pods of ``shape`` fit on GPUs of (model, free units, untouched) with ``cpu_free`` cores left
    (``None``: not limited)."""
    if shape.gpu_count == 1 and not shape.exclusive and shape.per_gpu > 0:
        copies = sum(free // shape.per_gpu for model, free, _ in gpus if shape.models.accepts(model))
    else:
        copies = sum(1 for model, free, whole in gpus if free >= shape.per_gpu and (whole or not shape.exclusive)
                     and shape.models.accepts(model)) // shape.gpu_count
    if cpu_free is not None and shape.cpu_milli > 0:
        copies = min(copies, max(cpu_free, 0) // shape.cpu_milli)
    return copies


