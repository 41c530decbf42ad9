"""The lookahead that also knows which GPU models are scarce for the pods that can run only on them, which
nodes a large shape needs, and which nodes are short of cores for their GPUs.

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

The charge applies from the first pod on, whatever g still has free. It used to apply only while g had no more
free than the constrained demand still to come (pressure(g) x g's capacity x the cluster's free share, as if the
rest of the cluster filled at the same pace), since charging throughout pushed CPU-heavy pods onto G2 nodes whose
GPUs they stranded (gpuspec10 lost 0.3 points then); the balance of cores to GPUs below now charges for that
stranding itself. And the even pace fails where the charge matters most: where some model's constrained demand
exceeds its capacity (a third of openb's GPU pods bound to models, T4 and P100 claimed 1.25 and 1.31 times over),
flexible pods took the GPUs of the less pressed models (V100, G3) while these looked free, and the pods
constrained to them failed later: 8.16% of the GPUs unallocated at 100% arrival against binpack's 6.66, 6.64
charged throughout (docs/policies.md).

The same reasoning keeps the nodes that a shape confined by node size needs: a shape that fewer than half the
nodes whose GPUs could hold it have the CPU for (openb's 8-GPU, 120-core pods: the 39 128-core G3 nodes of 617
with eight GPUs). Its expected demand still to come is its probability times the pods the free GPU memory can
still take; with D ~ Poisson(that) and K copies the cluster can still host, a placement that takes the node's
capacity for a copy pays the copy's GPU memory x P(D >= K) (then P(D >= K - 1) for a second copy, ...): the
chance that the copy lost was needed. Pricing every copy taken instead, whatever was left, lost as much on
1-GPU pods as it saved on 8-GPU ones.

Last, the cores. The lookahead asks, shape by shape, how many copies of each shape the node's free CPU
allows; on a node with few cores per GPU (openb's 4-GPU V100M16 nodes with 32 cores, 8 per GPU) most idle
memory is already fragment for the CPU-heavy shapes, and any pod that takes a GPU there shrinks it, whatever
cores it takes with it. So CPU-heavy pods fill those nodes and leave their other GPUs without cores: on
multigpu30, seed 47, 14.5 idle GPUs on them at 100% arrival against 4.2 under ``fgd``. The GPU work still to
come brings, on average, ``cores_per_unit`` (its CPU over its GPU memory, from the learned histogram) with
each unit of GPU memory; the node's idle memory beyond what its free cores can feed at that rate is stranded
(``stranded``), and a GPU pod pays ``BALANCE_WEIGHT`` times what it adds to that: a CPU-heavy one on a node
with few cores left pays, one with fewer cores per unit than the workload's pays nothing and gains nothing.
Letting frugal pods gain what they lower it by attracted them to every node the rate calls starved: with the
rate above the cores per GPU of the common nodes (the learned rate times 1.25 on the openb traces: all the G2
nodes), pods failed from 75% arrival on and multigpu30 went from 3.2 to 10.8. A pod without GPUs pays no
balance: the lookahead already counts what its cores take from the GPU shapes' copies, and charging it as well
cost the CPU family most where the cluster's cores run out first (three times cpu100's CPU-only work, seeds
42-45: 6.70 against 5.99 without; docs/policies.md).

The demand is learned from the pods seen (the whole decayed histogram, since constrained shapes are many and
small; the lookahead's target is the whole histogram too, see ``__init__``); the capacity per model comes from
``observe_inventory`` and the free capacity from ``observe_nodes``, both fed by the caller (the extender's
node cache and its log of changed nodes, the replay's node list and each node it places a pod on). Charges
are recomputed when a node is observed and change ``version`` only when one moves (probabilities in steps of
1/``RESERVE_LEVELS``).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, islice, repeat
from operator import mul, sub

from gpushare.contract import PodRequest
from gpushare.model import Node
from gpushare.policies.fgd import PRECISION, Demand, demand_of
from gpushare.policies.lookahead import FragmentationLookahead
from gpushare.policies.workload import MAX_SHAPES, Shape, WorkloadDistribution


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
# What a unit of GPU memory stranded for want of cores costs, in units of fragmentation. One unit undercharges:
# the lookahead credits a pod on a starved node with the idle memory it takes, which is fragment for the
# CPU-heavy shapes already, whatever cores the pod takes, and the balance must outweigh that credit (the nine
# shared traces, seeds 42-45: mean 4.65 at 1, 4.61 at 2; docs/policies.md).
BALANCE_WEIGHT = 2.0
# A shape is confined by node size when fewer than this share of the nodes whose GPUs could hold it have the
# CPU for it as well (the openb trace's 8-GPU, 120-core pods: 39 of 617 nodes).
CONFINED_SHARE = 0.5
# The reserve's probabilities are kept in steps of 1/RESERVE_LEVELS, so that scores (and ``version``) change
# only when one moves by a step, not with every pod placed.
RESERVE_LEVELS = 8
# Copies of a confined shape one placement can take from a node, at most, that the reserve prices.
RESERVE_DEPTH = 8


def copies(node: Node, shape: Shape, cpu_taken: int = 0, taken: Mapping[int, int] | None = None) -> int:
    """How many pods of ``shape`` the node could still host, by its GPUs and free CPU (a shape has no memory
    figure), after a pod took ``cpu_taken`` millicores and ``taken`` (GPU index -> units)."""
    gpus = slots = 0
    for gpu in node.gpus:
        if not gpu.healthy or gpu.exclusive or not shape.models.accepts(gpu.model):
            continue
        units = taken.get(gpu.index, 0) if taken else 0
        if shape.exclusive:
            gpus += gpu.used == 0 and gpu.holders == 0 and not units
            continue
        free = gpu.total - gpu.used - units
        if free >= shape.per_gpu:
            gpus += 1
            slots += free // shape.per_gpu if shape.per_gpu else 1
    count = slots if shape.gpu_count == 1 and not shape.exclusive else gpus // shape.gpu_count
    if node.cpu_milli and shape.cpu_milli:
        count = min(count, (node.cpu_milli - node.cpu_used - cpu_taken) // shape.cpu_milli)
    return max(count, 0)


def demand_beyond(mean: float, hosts: int, depth: int = 1) -> tuple[float, ...]:
    """P(D >= hosts - i) for i < ``depth`` and D ~ Poisson(mean): the chance that the last of ``hosts``
    places is needed, then the one before it, and so on.

    Every bind reprices, and a reserve can have hundreds of places left: the Poisson terms are summed in
    C-level passes, term by term in the same order and arithmetic as a loop over all of them would, and the
    sum stops where the rest cannot change it, so the answer has the same bits as that loop's.
    """
    below = [0.0]  # below[k] = P(D < k), up to where it stops changing
    if mean > 0 and hosts > 0:
        # Twelve standard deviations past the mean a term is below 1e-30, far under the last bit of the sum.
        count = min(hosts, int(mean + 12 * math.sqrt(mean)) + 40)
        terms = _poisson_terms(mean, count)
        below = list(accumulate(terms, initial=0.0))
        # Past the mean the terms shrink, so once one is under half the sum's last bit, adding each of the rest
        # leaves the sum as it is; checked, not assumed, since the stop was chosen by an estimate.
        if count < hosts and not (count - 1 > mean and terms[-1] < math.ulp(below[-1]) / 4):
            below = list(accumulate(_poisson_terms(mean, hosts), initial=0.0))
    return tuple(1.0 if hosts - i <= 0 else 0.0 if mean <= 0 else max(0.0, 1.0 - below[min(hosts - i, len(below) - 1)])
                 for i in range(depth))


# A reserve goes unpriced while the chance that its last place is needed is under half a step of its price:
# ``surely_unneeded`` says so from a bound, with a tenth of that half step to spare for rounding.
UNNEEDED_BELOW = 0.45 / RESERVE_LEVELS


def surely_unneeded(mean: float, hosts: int) -> bool:
    """Whether P(D >= hosts), D ~ Poisson(mean), is surely below ``UNNEEDED_BELOW``, by the Chernoff bound
    P(D >= k) <= exp(-mean) (e mean / k)^k for k > mean.

    Every bind reprices every reserve, and most of the time a reserve has many more places left than its pods
    still to come: the bound settles it without summing the Poisson terms (on gpuspec20 at 5,000 of openb's
    nodes no reserve was priced in 6,000 binds, and the sums had taken half of the 88 us each catch-up cost).
    """
    if hosts <= 0:
        return False
    if mean <= 0:
        return True
    return hosts > mean and math.exp(hosts * (1.0 + math.log(mean) - math.log(hosts)) - mean) < UNNEEDED_BELOW


def _poisson_terms(mean: float, count: int) -> list[float]:
    """P(D = k) for k < ``count``, D ~ Poisson(mean > 0), as exp(k ln(mean) - mean - ln(k!))."""
    exponents = map(sub, map(sub, map(mul, range(count), repeat(math.log(mean))), repeat(mean)),
                    _log_factorials(count))
    return list(map(math.exp, exponents))


_log_factorials_known: tuple[float, ...] = ()
_log_factorials_lock = threading.Lock()


def _log_factorials(count: int) -> tuple[float, ...]:
    """ln(k!) for k < ``count`` at least (``math.lgamma(k + 1)``), each computed once."""
    global _log_factorials_known
    known = _log_factorials_known
    if len(known) < count:
        with _log_factorials_lock:
            known = _log_factorials_known
            if len(known) < count:
                known = _log_factorials_known = known + tuple(math.lgamma(k + 1) for k in range(len(known), count))
    return known


def cores_per_unit(histogram: Mapping[Shape, float]) -> float:
    """The CPU (millicores) that the GPU work of ``histogram`` brings per unit of GPU memory; 0 without any.
    CPU-only shapes are left out: they use no GPU memory, so it is not theirs to feed."""
    units = sum(p * s.gpu_count * s.per_gpu for s, p in histogram.items())
    cpu = sum(p * s.cpu_milli for s, p in histogram.items() if s.gpu_count)
    return cpu / units if units > 0 else 0.0


def stranded(idle: int, cpu_free: int, per_unit: float) -> float:
    """The idle GPU memory that ``cpu_free`` millicores cannot feed at ``per_unit`` millicores per unit."""
    return max(0.0, idle - cpu_free / per_unit) if per_unit > 0 else 0.0


# What decides whether a node may host a shape at all: its CPU and its healthy GPUs' models and sizes.
_Size = tuple[int, tuple[tuple[str, int], ...]]


def _size(node: Node) -> _Size:
    return node.cpu_milli, tuple(sorted((g.model, g.total) for g in node.gpus if g.healthy))


def _gpus_may_host(size: _Size, shape: Shape) -> bool:
    """Whether a node of ``size`` has GPUs enough, of a model the shape accepts and each large enough, for it."""
    room = sum(1 for model, total in size[1] if total >= shape.per_gpu and shape.models.accepts(model))
    return room >= shape.gpu_count


@dataclass(frozen=True, slots=True)
class _Reserve:
    """A shape that only a few nodes can hold by size, with its GPU memory per pod and its host nodes."""

    shape: Shape
    probability: float
    units: int
    hosts: frozenset[str]


# Per model the charge per unit taken; per reserve that may be needed, its price per copy lost (next, then after);
# the millicores the GPU work to come brings per unit of GPU memory.
_Prices = tuple[dict[str, float], tuple[tuple[_Reserve, tuple[float, ...]], ...], float]
# Changes of ``version`` whose reach ``unchanged_since`` remembers; a version further back counts as every node
# changed. A few hundred changes over 10,000 pods of any shared trace.
REPRICES_KEPT = 256


@dataclass(frozen=True, slots=True)
class _Repriced:
    """What a change of ``version`` touched: every node, or the ``hosts`` of reserves whose price moved."""

    every_node: bool
    hosts: frozenset[str] = frozenset()


_EVERY_NODE = _Repriced(every_node=True)


def _touched(old: _Prices, new: _Prices) -> _Repriced:
    """What moving from the ``old`` prices to the ``new`` ones touched, nothing learned in between: the model
    charges and the cores per unit follow what is learned only, so only reserve prices can have moved."""
    before, after = dict(old[1]), dict(new[1])
    moved = [reserve for reserve in before.keys() | after.keys() if before.get(reserve) != after.get(reserve)]
    return _Repriced(False, frozenset().union(*(r.hosts for r in moved)))


class ScarcityLookahead(FragmentationLookahead):
    """``fgd-lookahead`` plus the cost of taking capacity that some expected demand has no alternative to:
    GPUs of a model that constrained demand needs, and the last nodes that can hold a shape confined by node
    size; and the cost of leaving GPUs without the cores to use them."""

    name = "fgd-scarcity"

    def __init__(self, workload: WorkloadDistribution | None = None) -> None:
        # Every learned shape, not the most frequent 95%: the rare large ones (eight GPUs and 120 cores) are
        # the ones whose room the lookahead must keep, and the first to fail when it does not count them.
        super().__init__(workload if workload is not None else WorkloadDistribution(coverage=WHOLE_WORKLOAD))
        self._capacity: dict[str, int] = {}
        # Per pressed model (pressure above 0), what a unit of its GPU memory pays, its pressure: worked out when the
        # workload, inventory or node sizes are learned (``_reprice``), not at each repricing.
        self._charge: dict[str, float] = {}
        self._basis: tuple[int, int, int] = (-1, 0, 0)
        self._inventory_version = 0
        self._sizes_version = 0
        self._version = 0
        # The cluster as last observed: each node, its size, and its free GPU memory per model.
        self._nodes: dict[str, Node] = {}
        self._sizes: dict[str, _Size] = {}
        # The same, by size: a cluster has few sizes, so finding the shapes confined by size is a pass over them,
        # not over every node each time the workload moves.
        self._by_size: dict[_Size, set[str]] = {}
        self._node_free: dict[str, dict[str, int]] = {}
        self._free: dict[str, int] = {}
        # Per GPU demand, the CPU and nodes of each size whose GPUs may host it (``_confined``), while the sizes last.
        self._sized_hosts: tuple[int, dict[Demand, list[tuple[int, set[str]]]]] = (-1, {})
        self._reserves: tuple[_Reserve, ...] = ()
        self._hosted: list[dict[str, int]] = []  # per reserve: host node -> copies it could still take
        self._mean_units = 0.0
        self._cores_per_unit = 0.0
        self._dirty = True
        # What placements pay, derived from the above: per model, and per reserve the price of each copy lost;
        # one attribute, replaced whole, so that an evaluation never reads one half old and the other new.
        self._prices: _Prices = ({}, (), 0.0)
        # What each of the last ``REPRICES_KEPT`` changes of ``version`` touched (``unchanged_since``), oldest first:
        # the last one made the current version, each one before it the version before; and what the changes since a
        # version touched, worked out once per version asked about.
        self._repriced: deque[_Repriced] = deque(maxlen=REPRICES_KEPT)
        self._touched_since: dict[int, _Repriced] = {}
        # The extender observes from one thread while bind may evaluate in another.
        self._lock = threading.Lock()

    def observe_inventory(self, capacity: Mapping[str, int]) -> None:
        """The cluster's GPU capacity per model, in memory units (healthy GPUs)."""
        if dict(capacity) != self._capacity:
            self._capacity = dict(capacity)
            self._inventory_version += 1

    def observe_nodes(self, nodes: Iterable[Node], gone: Iterable[str] = ()) -> None:
        with self._lock:
            self._observe(nodes, gone)

    def _observe(self, nodes: Iterable[Node], gone: Iterable[str]) -> None:
        for name in gone:
            if self._nodes.pop(name, None) is not None:
                self._resize(name, None)
                self._count_free(name, {})
                for hosted in self._hosted:
                    hosted.pop(name, None)
        for node in nodes:
            name = node.name
            self._nodes[name] = node
            size = _size(node)
            if self._sizes.get(name) != size:
                self._resize(name, size)
            free: dict[str, int] = {}
            for gpu in node.gpus:
                free[gpu.model] = free.get(gpu.model, 0) + gpu.free
            self._count_free(name, free)
            for reserve, hosted in zip(self._reserves, self._hosted, strict=True):
                if name in reserve.hosts:
                    hosted[name] = copies(node, reserve.shape)
        self._dirty = True

    def _resize(self, name: str, size: _Size | None) -> None:
        """Record the node's new size (``None``: it left)."""
        old = self._sizes.pop(name, None)
        if old is not None:
            names = self._by_size[old]
            names.discard(name)
            if not names:
                del self._by_size[old]
        if size is not None:
            names = self._by_size.setdefault(size, set())
            # The nodes of one size share its tuple of GPUs: 0.6 kB a node otherwise, at eight GPUs (compiled, each
            # node's pair of CPU and GPUs is a tuple of its own, around the shared one).
            if names:
                size = self._sizes[next(iter(names))]
            names.add(name)
            self._sizes[name] = size
        self._sizes_version += 1

    def _count_free(self, name: str, free: dict[str, int]) -> None:
        for model, units in self._node_free.pop(name, {}).items():
            self._free[model] -= units
        for model, units in free.items():
            self._free[model] = self._free.get(model, 0) + units
        if free:
            self._node_free[name] = free

    @property
    def version(self) -> int:
        self._refresh()
        return self._version

    def _refresh(self) -> None:
        with self._lock:
            self._reprice()

    def _reprice(self) -> None:
        basis = (self.workload.version, self._inventory_version, self._sizes_version)
        learned = basis != self._basis
        if learned:
            self._basis = basis
            histogram = self.workload.histogram()
            self._charge = {m: r for m, r in model_pressure(histogram, self._capacity).items() if r > 0}
            self._mean_units = sum(p * s.gpu_count * s.per_gpu for s, p in histogram.items())
            self._cores_per_unit = cores_per_unit(histogram)
            # A reserve the target had before keeps its counts, which ``_observe`` kept up to date: counting every
            # host anew took a sixth of each change of target's 4.2 ms at 5,000 of openb's nodes.
            kept = {(r.shape, r.hosts): hosted for r, hosted in zip(self._reserves, self._hosted, strict=True)}
            self._reserves = self._confined(histogram)
            self._hosted = [kept.get((r.shape, r.hosts)) or {n: copies(self._nodes[n], r.shape) for n in r.hosts}
                            for r in self._reserves]
        elif not self._dirty:
            return
        self._dirty = False
        prices = self._charges()
        if learned or prices != self._prices:
            touched = _EVERY_NODE if learned else _touched(self._prices, prices)
            self._prices = prices
            self._version += 1
            self._repriced.append(touched)
            self._touched_since.clear()

    def unchanged_since(self, version: int, node: Node) -> bool:
        """Whether ``evaluate`` answers for ``node`` now as it did while ``version`` was current.

        A change of ``version`` that learned nothing moves the price of some reserve's copies, which only the
        reserve's hosts pay: the other nodes keep their answers. Learning (the workload, the inventory, the
        nodes' sizes) changes every node's, the model charges and the balance among them.
        """
        with self._lock:
            if version == self._version:
                return True
            if version > self._version:  # not a version this policy has had
                return False
            touched = self._touched_since.get(version)
            if touched is None:
                since = self._version - version
                if since > len(self._repriced):  # older than the changes kept
                    touched = _EVERY_NODE
                else:
                    changes = list(islice(reversed(self._repriced), since))
                    touched = _Repriced(any(c.every_node for c in changes),
                                        frozenset().union(*(c.hosts for c in changes)))
                self._touched_since[version] = touched
        return not touched.every_node and node.name not in touched.hosts

    def _confined(self, histogram: Mapping[Shape, float]) -> tuple[_Reserve, ...]:
        reserves = []
        # The sizes whose GPUs may host a shape are found once per GPU demand, and kept until the sizes change: a
        # target's shapes differ mostly in CPU (on gpuspec20 67 shapes have 27 GPU demands), and checking each
        # shape's GPUs against every size took two thirds of each change of target's 4.2 ms at 5,000 of openb's
        # nodes.
        version, sizes_for = self._sized_hosts
        if version != self._sizes_version or len(sizes_for) > MAX_SHAPES:
            sizes_for = {}
            self._sized_hosts = (self._sizes_version, sizes_for)
        for shape, probability in histogram.items():
            if shape.gpu_count == 0:
                continue
            demand = demand_of(shape)
            sizes = sizes_for.get(demand)
            if sizes is None:
                sizes = sizes_for[demand] = [(size[0], names) for size, names in self._by_size.items()
                                             if _gpus_may_host(size, shape)]
            room = sum(len(names) for _, names in sizes)
            hosting = [names for cpu_milli, names in sizes if not cpu_milli or cpu_milli >= shape.cpu_milli]
            count = sum(map(len, hosting))
            if count and count < CONFINED_SHARE * room:
                reserves.append(_Reserve(shape, probability, shape.gpu_count * shape.per_gpu,
                                         frozenset().union(*hosting)))
        return tuple(reserves)

    def _charges(self) -> _Prices:
        """Per model, its pressure; per reserve, the chance that each of the next copies lost was needed, the demand
        still to come being its probability times the pods the free memory can still take; and the cores per unit
        of GPU memory."""
        free = sum(self._free.get(m, 0) for m in self._capacity)
        prices = []
        for reserve, hosted in zip(self._reserves, self._hosted, strict=True):
            expected = reserve.probability * free / self._mean_units if self._mean_units > 0 else 0.0
            left = sum(hosted.values())
            if surely_unneeded(expected, left):
                continue
            chances = demand_beyond(expected, left, RESERVE_DEPTH)
            price = tuple(round(p * RESERVE_LEVELS) / RESERVE_LEVELS for p in chances)
            # Priced while the next copy lost may be needed (the copies after it are likelier still).
            if price[0]:
                prices.append((reserve, price))
        return self._charge, tuple(prices), self._cores_per_unit

    def displacements(self, node: Node, request: PodRequest, takens: Sequence[dict[int, int]]) -> list[int]:
        self._refresh()
        charge, reserves, per_unit = self._prices
        # What the node has before the pod, read once for all its GPU choices.
        hosting = [(reserve, price, copies(node, reserve.shape)) for reserve, price in reserves
                   if node.name in reserve.hosts]
        idle, cpu_free = sum(g.free for g in node.gpus), node.cpu_milli - node.cpu_used
        stranded_now = stranded(idle, cpu_free, per_unit)
        costs = []
        for taken in takens:
            cost = 0.0
            for gpu in node.gpus:
                units = taken.get(gpu.index)
                if units:
                    cost += units * charge.get(gpu.model, 0.0)
            for reserve, price, now in hosting:
                lost = now - copies(node, reserve.shape, request.cpu_milli, taken)
                # Started at 0.0, so that the sum is a float even when no copy is lost: mypyc's compiled product of
                # an int and a "float or int" expects an int, and raised TypeError on the float.
                cost += reserve.units * sum(price[:lost], 0.0)
            if node.cpu_milli and request.gpu_count:  # a pod without GPUs: see the module docstring
                after = stranded(idle - sum(taken.values()), cpu_free - request.cpu_milli, per_unit)
                cost += BALANCE_WEIGHT * max(0.0, after - stranded_now)
            costs.append(round(cost * PRECISION))
        return costs
