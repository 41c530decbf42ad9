"""Fragmentation gradient descent (FGD, Weng et al., USENIX ATC 2023) on gpushare's node model.

A node's fragmentation for one expected task shape m is the idle GPU memory that m could not use there:
all of it if m cannot run on the node at all (no GPU of an accepted model, too little CPU, too few GPUs with
room) or needs no GPU, otherwise the idle memory on GPUs that m cannot use (too little free, or a model m
does not accept). The node's fragmentation F is the expectation over the target workload. FGD places a pod
where F grows least, trying every distinct GPU the pod could take on each node.

Growth is scored as the paper's simulator does: ``int(100 * sigmoid(-growth))`` with the growth in GPUs and
the target's probabilities summing to one. The score has 101 levels, a 25th of a GPU apart near zero growth
and ever coarser away from it; placements on the same level tie and go to node priority, which packs the
cluster (on the openb default trace this is worth 0.95 points of unallocated GPU over exact comparison).

Amounts are in the node's memory units and a task's share is absolute: a 4 GiB task needs 4 GiB free on
any card. In the openb trace every GPU is modelled as 1000 units, so units are the paper's gpu_milli. A
placement's growth is worked out with the pod's share cut to two significant digits (``share_class``), as the
target keeps shares: every share of the openb traces and every whole number of GiB up to 99 is its own class.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import TypeVar, cast

from gpushare.contract import ModelRule, PodRequest, Sharing
from gpushare.model import GPU, Node
from gpushare.policies.base import Candidate, pick_gpus
from gpushare.policies.workload import MAX_SHAPES, Shape, Target, WorkloadDistribution, share_class

# One model's GPUs on a node: the model, the free units of each GPU sorted, and those of untouched GPUs.
Pool = tuple[str, tuple[int, ...], tuple[int, ...]]
# What F depends on: the node's free CPU (or how many of the target's CPU thresholds it meets) and its pools.
StateKey = tuple[int, tuple[Pool, ...]]

# Another measure, and its state of the same node: F worked out for both in one pass (``FragmentationMeasure.of``).
Companion = tuple["FragmentationMeasure", StateKey]
# The memo of F per node state is dropped when it grows past this many entries.
MEMO_LIMIT = 200_000
# The memo of GPU choices per (GPU state, request) keeps at most this many entries, the oldest going first. A key
# holds each GPU's fields as a tuple of nine and an answer the pools after each choice: 1.4 kB a key and as much an
# answer when each had its own, 50 MiB for 20,000 entries at 15,000 of openb's nodes with 60,000 pods. A fleet has
# few distinct GPU rows and pools, so the entries kept share them (``gpu_choices``).
CHOICES_LIMIT = 20_000
# The rows, pools and units taken those entries share, each kept once: about one and a fifth an entry with every
# sharing pod its own share, far fewer where pods' shapes recur.
SHARED_LIMIT = 2 * CHOICES_LIMIT
# A memo's answer for a key it has not seen (its answers may be None).
_UNSEEN = object()
T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")
# A node with no CPU capacity recorded has no CPU limit.
UNLIMITED = 1 << 62
# Probabilities become integer weights (parts per million) so that F is an exact integer: placements that
# fragment equally compare equal, and the tie goes to node priority rather than to rounding noise.
PRECISION = 1_000_000
# The paper's node scores run from 0 to this (kube-scheduler's MaxNodeScore).
SCORE_LEVELS = 100


# One GPU demand of the target: GPU count, share per GPU, exclusive, accepted models. Many shapes differ only in
# CPU, so F's GPU side is worked out once per demand, not once per shape.
Demand = tuple[int, int, bool, ModelRule]


def demand_of(shape: Shape) -> Demand:
    return shape.gpu_count, shape.per_gpu, shape.exclusive, shape.models


# What one set of pools offers the GPU demands numbered in a ``DemandSides``: the pools' idle memory, and per demand of
# which a copy fits, four numbers in a row: the demand's number, the GPU memory it could use, how many copies of it the
# GPUs could take, and the memory one copy takes. Model rules leave most demands without a copy on a node: only the
# others are summed per call. One flat tuple an entry, not a tuple per demand: a store holds up to
# ``GPU_SIDES_LIMIT`` of them. An entry takes 1.5 kB (openb's default trace) to 3 kB (gpuspec20); one target's measure
# met at most 1,900 sets of pools in the replays and 5,749 at 15,000 nodes with 60,000 pods bound (gpuspec20's
# 10,000 pods on 5,000 nodes: 6,800 for all targets together), so the limit leaves room for more varied fleets and
# keeps a store under 60 MB.
GPUSide = tuple[int, tuple[int, ...]]
# How a set of pools was made from another by taking memory from one GPU: its model, its free memory before, the
# units taken (a one-GPU share placed on it) and whether it was untouched before.
Taking = tuple[str, int, int, bool]
# The pools a placement's pools after were made from, and how (see ``DemandSides.used_after``).
Origin = tuple[tuple[Pool, ...], Taking]
GPU_SIDES_LIMIT = 20_000
# The numbers all entries hold together: a bound on the store's memory whatever the number of demands. With hundreds
# of distinct GPU shares (memory asked in MiB, each pod its own amount) an entry lists a thousand numbers, and 5,130
# entries held 5.4 million within 4,000 pods on 5,000 nodes. The openb traces' stores stay below it: gpuspec20's held
# at most 359,000 in 4,938 entries over 6,000 pods (at the entry limit about 1.5 million), and one with three in five
# GPU pods bound to models 592,000 in 4,143 (at the entry limit about 2.9 million).
GPU_SIDE_NUMBERS_LIMIT = 3_000_000
# Demands one numbering takes before the policy starts another (and works the GPU sides out again): as many as the
# shapes a workload keeps, so that an entry lists no more demands than one target's measure did, and only a workload
# whose shapes keep changing starts a new numbering, now and then.
DEMANDS_LIMIT = MAX_SHAPES
# The distinct numbers the sides hold as one object each (``DemandSides._values``), those of sides gone included.
GPU_SIDE_VALUES_LIMIT = 200_000


def _bounded(store: OrderedDict[K, V], limit: int) -> None:
    """The oldest entries of ``store`` out, down to ``limit``."""
    while len(store) > limit:
        store.popitem(last=False)


def rank_left(keys: tuple[int, ...], value: int) -> int:
    """``bisect.bisect_left`` on a tuple of ints, compiled: F's sums bisect each listed demand's shapes by CPU, and a
    call into ``bisect`` boxed the value and took a tenth of a filter (gpushare60's pods each with their own share)."""
    low, high = 0, len(keys)
    while low < high:
        middle = (low + high) >> 1
        if keys[middle] < value:
            low = middle + 1
        else:
            high = middle
    return low


def rank_right(keys: tuple[int, ...], value: int) -> int:
    """``bisect.bisect_right`` on a tuple of ints, compiled (see ``rank_left``)."""
    low, high = 0, len(keys)
    while low < high:
        middle = (low + high) >> 1
        if value < keys[middle]:
            high = middle
        else:
            low = middle + 1
    return low


@dataclass(frozen=True, slots=True)
class Weights:
    """The shapes of one demand by their CPU's rank, ascending, with the running sum of their weights: the weight
    of the shapes a node has the CPU for is one bisection."""

    keys: tuple[int, ...]
    below: tuple[int, ...]  # below[i]: the weight of the first i shapes

    @classmethod
    def of(cls, pairs: Iterable[tuple[int, int]]) -> Weights:
        ordered = sorted(pairs)
        return cls(tuple(k for k, _ in ordered), tuple(accumulate((w for _, w in ordered), initial=0)))


class DemandSides:
    """GPU demands, each numbered once, and the GPU side of each set of pools met (``GPUSide``) for the demands
    numbered so far.

    What a demand could use of a set of pools depends on the demand and the pools only, not on a target's weights,
    so every measure a policy builds as it learns reads the same sides: a side worked out for one target holds for
    all later ones, and is only extended when a later target brings demands numbered since. The lookahead's measure
    and FGD's (its tie-break) share them too, since their targets are the same. On openb's gpuspec20 (10,000 pods on
    5,000 of openb's nodes) fgd-scarcity's two measures had each worked out about 22,000 sets of pools, half of them
    renumbered from the previous target's; one store works out 6,800 and extends 10,760 by a demand or a few.
    """

    def __init__(self, demands: Sequence[Demand] = ()) -> None:
        """``demands`` (distinct) take the first numbers, in order, however many."""
        self._numbers: dict[Demand, int] = {}
        self._demands: list[Demand] = []
        # Per demand's number, the number of its kind: its share, or ``None`` when exclusive (what a pool's offer to it
        # depends on, ``_offer``), numbered in order met.
        self._kinds: list[int] = []
        self._kind_numbers: dict[int | None, int] = {}
        # Per demand's number: the number, and the memory a copy takes when it is the same on every set of pools (a
        # share: ``None`` otherwise), as the objects ``_values`` holds: read as they are, not looked up there, for
        # every demand a side lists (a side worked out afresh took a third less time, 100 demands in 197 listed).
        self._fixed: list[tuple[object, object | None]] = []
        # Per demand's number: its share where it is a one-GPU share (one GPU, a share of memory, not exclusive), whose
        # copies are counted GPU by GPU (``_hosted``) and moved by the share a placement takes (``used_after``), else 0;
        # read as one int instead of unpacking the demand.
        self._moving: list[int] = []
        # Per demand's number where it is not a one-GPU share: the least free memory a GPU needs for its offer to the
        # demand to count it (its share), or -1 where its offer counts untouched GPUs only (exclusive); else 0.
        self._reach: list[int] = []
        self._accepts: dict[str, tuple[bool, ...]] = {}
        # Per set of pools: how many demands its side covers (the first so many numbers), and the side.
        self._sides: OrderedDict[tuple[Pool, ...], tuple[int, GPUSide]] = OrderedDict()
        self._numbers_held = 0  # the length of every entry's side, summed
        # Each number the sides hold, as one object however many sides hold it: a million numbers over 9,000 sides
        # took 863 distinct values (gpuspec20's pods with their CPU spread, 10,000 on 5,000 of openb's nodes), and an
        # int object each cost 28 bytes beyond its place in the tuple. Typed ``object`` so that compiled code keeps
        # the object kept here instead of boxing the value anew. Emptied past ``GPU_SIDE_VALUES_LIMIT``.
        self._values: dict[object, object] = {}
        for demand in demands:
            self._add(demand)

    def _add(self, demand: Demand) -> None:
        """Number ``demand`` (new to this numbering)."""
        count, per_gpu, exclusive, _ = demand
        kind = None if exclusive else per_gpu
        kind_number = self._kind_numbers.get(kind)
        if kind_number is None:
            kind_number = self._kind_numbers[kind] = len(self._kind_numbers)
        number: object = len(self._demands)
        per_copy: object | None = per_gpu * count if per_gpu > 0 and not exclusive else None
        self._fixed.append(self._kept(number, per_copy))
        moving = per_gpu if count == 1 and per_gpu > 0 and not exclusive else 0
        self._moving.append(moving)
        self._reach.append(0 if moving else -1 if exclusive else per_gpu)
        self._numbers[demand] = len(self._demands)
        self._demands.append(demand)
        self._kinds.append(kind_number)

    def _kept(self, number: object, per_copy: object | None) -> tuple[object, object | None]:
        """A demand's fixed numbers as the objects ``_values`` holds."""
        values = self._values
        return values.setdefault(number, number), None if per_copy is None else values.setdefault(per_copy, per_copy)

    def number(self, demands: Sequence[Demand]) -> list[int] | None:
        """The numbers of ``demands`` (distinct), numbering those new to it; ``None``, numbering none, when they would
        take it past ``DEMANDS_LIMIT``."""
        new = [demand for demand in demands if demand not in self._numbers]
        if len(self._demands) + len(new) > DEMANDS_LIMIT:
            return None
        for demand in new:
            self._add(demand)
        return [self._numbers[demand] for demand in demands]

    def table_size(self) -> int:
        """How long a table indexed by this numbering's numbers must be: no number ever reaches it."""
        return max(DEMANDS_LIMIT, len(self._demands))

    def side(self, pools: tuple[Pool, ...], covering: int) -> GPUSide:
        """The pools' GPU side, covering at least the first ``covering`` demands numbered."""
        return self._entry(pools, covering)[1]

    def _entry(self, pools: tuple[Pool, ...], covering: int) -> tuple[int, GPUSide]:
        """``side``'s entry in the store: how many demands the side covers (the first so many numbers), and the
        side."""
        found = self._sides.get(pools)
        if found is not None and found[0] >= covering:
            self._sides.move_to_end(pools)  # the store lets the sides read least recently go first
            return found
        # A side worked out before some demand was numbered is extended by those numbered since.
        covered, (idle, hosted) = found if found is not None else (0, (sum(sum(frees) for _, frees, _ in pools), ()))
        numbered = len(self._demands)
        new = self._hosted(pools, range(covered, numbered))
        side = (idle, hosted + cast(tuple[int, ...], tuple(new)))
        sides = self._sides
        # An extended entry replaces the one it was worked out from, as the one read last. (Another thread's filter
        # may have pushed that one out meanwhile.)
        if found is not None:
            sides.pop(pools, None)
        entry = sides[pools] = (numbered, side)
        held = self._numbers_held + len(new)
        # The entries read least recently go, one at a time, never all at once: emptied whole, a store at its bound
        # on numbers freed 3 million of them in 8 ms, and every set of pools the next filters met was worked out
        # afresh. With every sharing pod its own share (a side lists about 130 demands, so the store holds about
        # 6,000 sides) it filled every few hundred pods: over 6,000 pods on 5,000 nodes the sides worked out afresh
        # listed 7.7 million demands, 3.3 million with the oldest entries going first, 2.4 million with these.
        while (held > GPU_SIDE_NUMBERS_LIMIT or len(sides) > GPU_SIDES_LIMIT) and len(sides) > 1:
            _, (_, (_, oldest)) = sides.popitem(last=False)
            held -= len(oldest)
        self._numbers_held = held
        if len(self._values) > GPU_SIDE_VALUES_LIMIT:
            # The values of sides gone are kept here until this: kept anew, from the sides worked out next.
            self._values.clear()
            self._fixed = [self._kept(number, per_copy) for number, per_copy in self._fixed]
        return entry

    def _accepted(self, model: str, numbered: int) -> tuple[bool, ...]:
        """Per demand numbered (at least the first ``numbered``), whether it accepts ``model``."""
        found = self._accepts.get(model)
        if found is None or len(found) < numbered:
            found = self._accepts[model] = tuple(rule.accepts(model) for _, _, _, rule in self._demands[:numbered])
        return found

    def used_after(self, pools: tuple[Pool, ...], origin: Origin, covering: int, measure: FragmentationMeasure,
                   cpu: int, second: FragmentationMeasure | None = None, second_cpu: int = 0) -> tuple[int, int, int]:
        """The idle memory of a placement's pools after (``pools``, made from ``origin``), and what ``measure``'s target
        could use of it on a node whose free CPU has ``cpu`` as its key (``FragmentationMeasure.used``), summed over the
        origin's side (covering at least the first ``covering`` demands) as the share taken moves it; the same for
        ``second`` (0 without), in the same pass.

        Memory taken never lets a copy fit that did not, so only the demands the side before lists can be hosted after.
        A one-GPU share uses the GPUs' memory one by one, so its usable memory and copies move by that GPU's alone; the
        other demands that GPU counted (several GPUs, or whole ones where it was untouched) are worked out afresh.

        The side after is not worked out: a placement weighed is rarely the one bound (with every sharing pod its own
        share, never exactly), and each side worked out boxed and kept its numbers, stored and later freed a tuple of
        hundreds, and left it to the collector. With every pod its own share, that was a fifth of a filter's time. A
        pod bound there has its side worked out afresh when it is read: moving it from the side before instead made
        no difference to the published traces, whose placements recur (round 47, docs/throughput-history.md).
        """
        before, (model, free, taken, whole) = origin
        _, (idle, hosted) = self._entry(before, covering)
        left = free - taken
        accepts = self._accepted(model, len(self._demands))
        moving, reach = self._moving, self._reach
        used = used_second = 0
        # FGD's terms are one product each (``FragmentationMeasure.linear``): read as such, not called.
        first_linear = measure.linear(cpu)
        second_linear = None if second is None else second.linear(second_cpu)
        afresh: list[int] = []
        # An indexed loop over ints: compiled, the moved numbers stay machine integers, never boxed.
        for j in range(0, len(hosted), 4):
            i = hosted[j]
            usable, copies = hosted[j + 1], hosted[j + 2]
            if accepts[i]:
                per_gpu = moving[i]
                if per_gpu == 0:  # the GPU counted for it where it offered it room: worked out afresh
                    least = reach[i]
                    if whole if least < 0 else least <= free:
                        afresh.append(i)
                        continue
                elif per_gpu <= free:
                    copies += left // per_gpu - free // per_gpu
                    if copies <= 0:
                        continue
                    usable -= free - (left if left >= per_gpu else 0)
            if first_linear is not None:
                used += first_linear[i] * usable
            else:
                used += measure.term(cpu, i, usable, copies, hosted[j + 3])
            if second_linear is not None:
                used_second += second_linear[i] * usable
            elif second is not None:
                used_second += second.term(second_cpu, i, usable, copies, hosted[j + 3])
        if afresh:
            listed = cast(tuple[int, ...], tuple(self._hosted(pools, afresh)))
            used += measure.used(cpu, listed)
            if second is not None:
                used_second += second.used(second_cpu, listed)
        return idle - taken, used, used_second

    def _hosted(self, pools: tuple[Pool, ...], demands: Sequence[int]) -> list[object]:
        """Of ``demands`` (numbers), those of which a copy fits: the four numbers of each, as objects of ``_values``."""
        hosted: list[object] = []
        values = self._values
        kinds = self._kinds
        moving = self._moving
        # What a pool offers a demand depends on the demand's kind only, which many demands have in common
        # (gpuspec20's 63 demands have 20 of them): each pool works each kind out once per call, kept by the kind's
        # number (a list read, where a dict keyed by the share boxed each share anew).
        accepted = [(self._accepted(model, len(self._demands)), frees, wholes,
                     cast(list[tuple[int, int, int] | None], [None] * len(self._kind_numbers)))
                    for model, frees, wholes in pools]
        for i in demands:
            count, per_gpu, exclusive, _ = self._demands[i]
            kind = kinds[i]
            usable = copies = hosts = 0
            for accepts, frees, wholes, known in accepted:
                if not accepts[i]:
                    continue
                offer = known[kind]
                if offer is None:
                    offer = known[kind] = _offer(frees, wholes, per_gpu, exclusive)
                hosts += offer[0]
                usable += offer[1]
                copies += offer[2]
            if moving[i] == 0:  # not a one-GPU share: a copy needs ``count`` GPUs with room
                copies = hosts // count if count else 0
            if copies <= 0:  # not one copy fits (too few GPUs with room): its shapes use nothing
                continue
            # Boxed once each and kept as the object ``_values`` holds (see there), unless the demand has its own.
            number, per_copy = self._fixed[i]
            boxed_usable: object = usable
            boxed_copies: object = copies
            hosted.append(number)
            hosted.append(values.setdefault(boxed_usable, boxed_usable))
            hosted.append(values.setdefault(boxed_copies, boxed_copies))
            if per_copy is None:
                # Never more than usable / copies: each copy takes its share of the GPUs counted in ``usable``.
                boxed: object = usable // hosts * count if hosts else 0
                per_copy = values.setdefault(boxed, boxed)
            hosted.append(per_copy)
        return hosted


def _offer(frees: tuple[int, ...], wholes: tuple[int, ...], per_gpu: int, exclusive: bool) -> tuple[int, int, int]:
    """What one pool offers a demand of ``per_gpu`` (exclusive or not): how many of its GPUs have room, their free
    memory, and how many copies of a one-GPU share of ``per_gpu`` they take (0 for an exclusive demand, or none)."""
    if exclusive:
        return len(wholes), sum(wholes), 0
    # An indexed loop over ints: compiled, it runs on machine integers (a slice and a generator took a sixth more
    # of a side worked out afresh, where a pool meets every share the demands ask).
    first = rank_left(frees, per_gpu)
    usable = copies = 0
    for j in range(first, len(frees)):
        free = frees[j]
        usable += free
        if per_gpu > 0:
            copies += free // per_gpu
    return len(frees) - first, usable, copies


class SharedSides:
    """The ``DemandSides`` the measures of one workload share, started afresh when a target brings more demands
    than the current numbering has room for. A measure keeps the numbering it was built on."""

    def __init__(self) -> None:
        self._sides = DemandSides()
        self._lock = threading.Lock()

    def numbering(self, demands: Sequence[Demand]) -> tuple[DemandSides, list[int]]:
        """The numbering the measure of a target with ``demands`` (distinct) reads, and their numbers there."""
        with self._lock:  # policies of one workload may build their measures on different threads
            numbers = self._sides.number(demands)
            if numbers is None:
                self._sides = DemandSides(demands)
                numbers = list(range(len(demands)))
            return self._sides, numbers


class FragmentationMeasure:
    """F for one target workload: the README's measure, prepared for fast evaluation.

    F depends on the node's free CPU only through which of the target's CPU thresholds it meets, so the
    state a value is memoised under records that class, not the exact amount. A shape that needs no GPU
    can use no idle GPU memory, so all of it is fragment for that shape (the paper's rule).

    F is the idle memory times the target's whole weight, less what each shape could use, weighted: a shape's
    use depends on its demand's GPU side (``DemandSides``) and on its CPU, so shapes are summed per demand by
    their CPU's rank. Tables per demand are indexed by the demand's number, ``None`` for the numbers of demands
    outside the target (a GPU side lists every demand numbered when it was worked out).
    """

    def __init__(self, target: Target, shared: SharedSides) -> None:
        self.coverage = sum(p for _, p in target) or 1.0
        self.thresholds = tuple(sorted({shape.cpu_milli for shape, _ in target}))
        weighted = [(shape, round(p * PRECISION)) for shape, p in target]
        self.weight = sum(w for _, w in weighted)
        shapes: dict[Demand, list[tuple[int, int]]] = {}
        cpu_only = []
        for shape, weight in weighted:
            if shape.gpu_count == 0:
                cpu_only.append((shape.cpu_milli, weight))
            else:
                demand = demand_of(shape)
                shapes.setdefault(demand, []).append((shape.cpu_milli, weight))
        self._sides, self.numbers = shared.numbering(tuple(shapes))
        # Per demand its shapes' CPU and weight; the same for the shapes that need no GPU.
        self.demand_shapes = tuple(tuple(pairs) for pairs in shapes.values())
        self.cpu_only = tuple(cpu_only)
        self._covering = max(self.numbers, default=-1) + 1
        # Per demand's number its shapes by the rank of their CPU among the thresholds (what a state records).
        self._by_rank = self.by_number(Weights.of((rank_left(self.thresholds, cpu), w) for cpu, w in pairs)
                                       for pairs in shapes.values())
        # Per key of a node's free CPU in a state, the weight of the shapes that CPU lets run, by demand's number (0
        # outside the target): ``term`` reads one number instead of bisecting a demand's shapes at each call, and a
        # key's row is worked out the first time it is met. At most a row per threshold and one more, each as long as
        # the numbering: 2 MB with every one of ``MAX_SHAPES`` shapes its own CPU and every key met.
        self._weights_at: list[tuple[int, ...] | None] = [None] * (len(self.thresholds) + 1)
        # F per state, for this target only: a new target comes with a new measure, so no answer outlives its target.
        self._memo: dict[StateKey, int] = {}

    def by_number(self, values: Iterable[T]) -> list[T | None]:
        """A table indexed by demand number: ``values`` in the order of the target's demands, ``None`` elsewhere."""
        table: list[T | None] = [None] * self._sides.table_size()
        for number, value in zip(self.numbers, values, strict=True):
            table[number] = value
        return table

    def state(self, cpu_free: int, pools: tuple[Pool, ...]) -> StateKey:
        return (rank_right(self.thresholds, cpu_free), pools)

    def of(self, state: StateKey, origin: Origin | None = None, also: Companion | None = None) -> int:
        """F of ``state`` in memory units times ``PRECISION``, remembered: the idle memory times ``scale``, less
        what the target could use of it (``used``). ``origin``: the pools before and the share taken that made the
        state's pools (a placement's pools after), from which F is worked out (``DemandSides.used_after``); ``also``:
        another measure and its state of the same pools, whose F is worked out in the same pass and remembered there,
        where it is not already (the lookahead's tie-break weighs the same placements with FGD's F)."""
        found = self._memo.get(state)
        if found is None:
            if len(self._memo) >= MEMO_LIMIT:
                self._memo.clear()
            cpu, pools = state
            if origin is None:
                idle, hosted = self.gpu_side(pools)
                found = 0 if idle == 0 else idle * self.scale(cpu) - self.used(cpu, hosted)
            else:
                second, second_state = also if also is not None else (None, state)
                # Not where it is known already, nor on sides numbered otherwise (a target built on another numbering).
                if second is not None and (second_state in second._memo or second._sides is not self._sides):
                    second = None
                covering = self._covering if second is None else max(self._covering, second._covering)
                idle, used, used_second = self._sides.used_after(pools, origin, covering, self, cpu, second,
                                                                 second_state[0])
                found = 0 if idle == 0 else idle * self.scale(cpu) - used
                if second is not None:
                    second_cpu = second_state[0]
                    second.remember(second_state, 0 if idle == 0 else idle * second.scale(second_cpu) - used_second)
            self._memo[state] = found
        return found

    def remember(self, state: StateKey, value: int) -> None:
        """Keep ``value`` as F of ``state``, worked out by another measure's pass (``of``)."""
        if len(self._memo) >= MEMO_LIMIT:
            self._memo.clear()
        self._memo[state] = value

    def scale(self, cpu: int) -> int:
        """What a unit of idle memory weighs in F (``of``) before the target's use of it is taken off: the target's
        weight (``cpu``: the key of the node's free CPU in a state)."""
        return self.weight

    def used(self, cpu: int, hosted: tuple[int, ...]) -> int:
        """What the target could use of the memory of the demands listed in ``hosted`` (four numbers each, as a
        ``GPUSide`` lists them), weighted, on a node whose free CPU has ``cpu`` as its key in a state."""
        linear = self.linear(cpu)
        used = 0
        for i in range(0, len(hosted), 4):
            if linear is not None:
                used += linear[hosted[i]] * hosted[i + 1]
            else:
                used += self.term(cpu, hosted[i], hosted[i + 1], hosted[i + 2], hosted[i + 3])
        return used

    def term(self, cpu: int, number: int, usable: int, copies: int, per_copy: int) -> int:
        """``used`` for one demand (by its number) of which ``copies`` fit, using ``usable`` memory, ``per_copy`` a
        copy."""
        return self._weights(cpu)[number] * usable

    def linear(self, cpu: int) -> tuple[int, ...] | None:
        """Where ``term`` is a demand's usable memory times a weight that depends on the CPU key alone (FGD's), those
        weights by demand's number at ``cpu``, for callers that sum many terms at one key to multiply instead of
        calling ``term``; ``None`` where it is not (the lookahead's)."""
        return self._weights(cpu)

    def _weights(self, cpu: int) -> tuple[int, ...]:
        """The weights ``term`` multiplies at ``cpu``, by demand's number (see ``_weights_at``)."""
        weights = self._weights_at[cpu]
        if weights is None:
            # The shapes whose CPU the node still has: the others can use nothing.
            weights = self._weights_at[cpu] = tuple(0 if ranks is None else ranks.below[rank_left(ranks.keys, cpu)]
                                                    for ranks in self._by_rank)
        return weights

    def gpu_side(self, pools: tuple[Pool, ...]) -> GPUSide:
        """The pools' idle memory, and the four numbers of each demand of which a copy fits (see ``GPUSide``)."""
        return self._sides.side(pools, self._covering)


def _whole(gpu: GPU) -> bool:
    return gpu.total > 0 and gpu.used == 0 and gpu.holders == 0 and gpu.free == gpu.total


# What F reads of one GPU: its index, model, free units and whether it is untouched.
Row = tuple[int, str, int, bool]


def _rows(gpus: Sequence[GPU]) -> list[Row]:
    """Read once per GPU state: a node's before and after states for every GPU choice are built from it."""
    return [(g.index, g.model, g.free, _whole(g)) for g in gpus]


def _pools(rows: Sequence[Row], changed: dict[int, int]) -> tuple[Pool, ...]:
    """The node's pools, with the GPUs in ``changed`` (index -> units taken) as if the pod were placed."""
    frees: dict[str, list[int]] = {}
    wholes: dict[str, list[int]] = {}
    for index, model, free, whole in rows:
        taken = changed.get(index)
        frees.setdefault(model, []).append(free if taken is None else free - taken)
        if taken is None and whole:
            wholes.setdefault(model, []).append(free)
    return tuple((model, tuple(sorted(values)), tuple(sorted(wholes.get(model, ()))))
                 for model, values in sorted(frees.items()))


# A node's GPU state: per GPU its index, model, total, used, compute used, holders, exclusive, healthy and NUMA
# node, then the GPUs' links and their sharing values.
GPUState = tuple[tuple[Hashable, ...], Hashable, Hashable]
# What the GPU choices for a request depend on: the GPU state and the request's GPU fields.
ChoicesKey = tuple[GPUState, int, int, int, bool, int, ModelRule, Sharing, bool]


def least_room(gpus: Sequence[GPU], request: PodRequest) -> int:
    """The least room for the request's share among the GPUs with enough (free memory, or a whole GPU's for an
    exclusive pod: what ``GPU.has_room`` compares the share with); -1 where none has enough. A share fits the same
    GPUs as this amount does."""
    least = -1
    per_gpu, exclusive = request.per_gpu, request.exclusive
    for gpu in gpus:
        room = gpu.total if exclusive else gpu.total - gpu.used
        if per_gpu <= room and (least < 0 or room < least):
            least = room
    return least


def gpu_state(node: Node) -> GPUState:
    """Everything about a node's GPUs that the GPU choices of a placement read (``can_host``, ``_rows``,
    ``pick_gpus``' topology): the GPU half of ``model.state_signature``."""
    rows: list[Hashable] = []
    links: list[Hashable] = []
    sharing: list[Hashable] = []
    # One compiled pass reading the fields as native attributes, not ``attrgetter`` and two generators: this key is
    # built for every node state a policy weighs a pod against, memo hit or not.
    for g in node.gpus:
        rows.append((g.index, g.model, g.total, g.used, g.compute_used, g.holders, g.exclusive, g.healthy, g.numa))
        if g.links:
            links.append((g.index, tuple(sorted(g.links.items()))))
        # The sharing rules' counts decide ``can_host`` for pods with sharing values (and exclusion for every pod).
        if g.affinity or g.anti_affinity or g.exclusion:
            sharing.append((g.index, tuple(sorted(g.affinity.items())), tuple(sorted(g.anti_affinity.items())),
                            tuple(sorted(g.exclusion.items()))))
    return tuple(rows), tuple(links), tuple(sharing)


@dataclass(frozen=True, slots=True)
class GPUChoices:
    """A node's GPU side for one request: its pools now, and per GPU set worth comparing the indices, the
    units taken from each and the pools after. It depends on the GPUs and the request only, not on the target
    workload, so it outlives target changes; nodes in the same GPU state share it."""

    before: tuple[Pool, ...]
    # Per option: the GPUs, the units taken of each, the pools after, and their origin where one GPU is shared.
    options: tuple[tuple[tuple[int, ...], dict[int, int], tuple[Pool, ...], Origin | None], ...]
    largest: int  # the node's largest GPU, in memory units (0 without GPUs)


class FragmentationGradient:
    """Place each pod where the node's expected fragmentation grows least, scored as the paper does. On a
    node, the first GPU set (lowest index) of those with the best score."""

    name = "fgd"
    measure_type: type[FragmentationMeasure] = FragmentationMeasure

    def __init__(self, workload: WorkloadDistribution | None = None, sides: SharedSides | None = None) -> None:
        """``sides``: the GPU sides of another policy on the same workload, to share (see ``DemandSides``)."""
        self.workload = workload if workload is not None else WorkloadDistribution()
        self.sides = sides if sides is not None else SharedSides()
        self._measure = self.measure_type(self.workload.target, self.sides)
        self._measure_version = self.workload.version
        self._choices: OrderedDict[ChoicesKey, GPUChoices | None] = OrderedDict()
        # The GPU rows the keys of ``_choices`` hold and the pools its answers hold, each once (see ``CHOICES_LIMIT``),
        # and the units taken of its answers' GPU choices likewise; each within ``SHARED_LIMIT``, the oldest going
        # first.
        self._shared: OrderedDict[Hashable, Hashable] = OrderedDict()
        self._takens: OrderedDict[tuple[tuple[int, int], ...], dict[int, int]] = OrderedDict()

    @property
    def version(self) -> int:
        """Changes whenever the target workload does, and with it the answers of ``evaluate``."""
        return self.workload.version

    def observe(self, request: PodRequest) -> None:
        self.workload.observe(Shape.of(request))

    def share_class(self, per_gpu: int) -> int:
        """A one-GPU share's growth is worked out with its class (``gpu_choices``), and the GPUs compared are every
        distinct one the exact share fits, the best counting (``ClassedShares``)."""
        return share_class(per_gpu)

    def measure(self) -> FragmentationMeasure:
        """The measure for the current target workload (rebuilt, with an empty memo, when it changes)."""
        if self._measure_version != self.workload.version:
            self._measure = self.measure_type(self.workload.target, self.sides)
            self._measure_version = self.workload.version
        return self._measure

    def fragmentation(self, node: Node) -> float:
        """The node's expected fragmentation F under the current target workload, in memory units."""
        measure = self.measure()
        pools = _pools(_rows(node.gpus), {})
        return measure.of(self._state(measure, node, node.cpu_milli - node.cpu_used, pools)) / PRECISION

    def evaluate(self, node: Node, request: PodRequest) -> Candidate | None:
        if not node.fits_host_resources(request):
            return None
        view = self.gpu_choices(node, request)
        return None if view is None else self.best(node, request, view)

    def best(self, node: Node, request: PodRequest, view: GPUChoices, also: FragmentationMeasure | None = None
             ) -> Candidate | None:
        """The best of the node's GPU choices for the request (CPU and memory already checked); ``also``: another
        measure that will weigh the same choices, whose F of each state after is worked out in the same pass."""
        measure = self.measure()  # once: one target for the whole comparison
        cpu_free = node.cpu_milli - node.cpu_used
        before = measure.of(self._state(measure, node, cpu_free, view.before))
        gpu_size = view.largest or 1
        best: tuple[tuple[float, ...], tuple[int, ...]] | None = None
        costs = self.displacements(node, request, [taken for _, taken, _, _ in view.options])
        for (gpus, _, pools, origin), cost in zip(view.options, costs, strict=True):
            after = self._state(measure, node, cpu_free - request.cpu_milli, pools)
            companion = None if also is None else (also, self._state(also, node, cpu_free - request.cpu_milli, pools))
            growth = measure.of(after, origin, companion) - before + cost
            rank = self.rank(growth, gpu_size)
            if best is None or rank > best[0]:
                best = (rank, gpus)
        if best is None:
            return None
        return Candidate(best[0][0], best[1])

    def gpu_choices(self, node: Node, request: PodRequest) -> GPUChoices | None:
        """The node's GPU side for the request (``None``: too few GPUs can host it), memoised per GPU state:
        most nodes a pod is weighed against share their GPU state with others, or with the same node before
        a target change."""
        # The share enters as the GPUs it fits and as its class: pods whose shares differ (memory asked in MiB, each
        # pod its own amount) have the same choices on a node where no GPU's room lies between them.
        key: ChoicesKey = (gpu_state(node), request.gpu_count, least_room(node.gpus, request),
                           share_class(request.per_gpu), request.exclusive, request.compute_percent, request.models,
                           request.sharing, request.affinity_held)
        # One lookup, not two: the key, a tuple of tuples, is hashed anew at each.
        known = self._choices.get(key, _UNSEEN)
        if known is not _UNSEEN:
            return cast(GPUChoices | None, known)
        found: GPUChoices | None = None
        hosts = node.hosts(request) if request.gpu_count else []
        if len(hosts) >= request.gpu_count:
            rows = _rows(node.gpus)
            # Weighed with its share's class, as the target keeps its pods (``share_class``): pods whose shares
            # differ by less than a class (memory asked in MiB, each its own amount) then meet the same states
            # after, whose F is remembered, instead of one never met for each. The GPUs compared are those the
            # exact share fits, and the bind takes the exact share.
            weighed = share_class(request.per_gpu)
            before = self._shared_pools(_pools(rows, {}))
            options = []
            for chosen in self.choices(hosts, request):
                taken = {g.index: g.free if request.exclusive else weighed for g in chosen}
                taken = self._takens.setdefault(tuple(taken.items()), taken)
                origin: Origin | None = None
                if len(chosen) == 1 and not request.exclusive:
                    origin = (before, (chosen[0].model, chosen[0].free, weighed, _whole(chosen[0])))
                options.append((tuple(g.index for g in chosen), taken, self._shared_pools(_pools(rows, taken)), origin))
            found = GPUChoices(before, tuple(options),
                               max((g.total for g in node.gpus), default=0))
        self._choices[self._stored_key(key)] = found
        # The oldest go one at a time (see ``DemandSides.side``): emptied whole, a memo at its bound took 29 ms to
        # free, in the middle of a filter.
        _bounded(self._choices, CHOICES_LIMIT)
        _bounded(self._shared, SHARED_LIMIT)
        _bounded(self._takens, SHARED_LIMIT)
        return found

    def _stored_key(self, key: ChoicesKey) -> ChoicesKey:
        """``key`` as the memo keeps it: each GPU's fields the tuple already kept for a GPU in that state, if any.
        Equal to ``key``, so lookups with a fresh key find it; only misses pay the sharing."""
        rows, links, sharing = key[0]
        shared = self._shared
        return ((tuple([shared.setdefault(row, row) for row in rows]), links, sharing), *key[1:])

    def _shared_pools(self, pools: tuple[Pool, ...]) -> tuple[Pool, ...]:
        """``pools`` with each pool the tuple already kept for an equal one, if any: a fleet's pools recur across
        nodes and GPU choices (eight untouched GPUs of one model), and each held its own free amounts."""
        shared = self._shared
        # Read and kept as objects: compiled, a ``Pool`` is unboxed into a struct and boxed anew as a new tuple.
        kept: list[Hashable] = [shared.setdefault(pool, pool) for pool in cast(tuple[Hashable, ...], pools)]
        return cast(tuple[Pool, ...], tuple(kept))

    def choices(self, hosts: Sequence[GPU], request: PodRequest) -> Iterator[tuple[GPU, ...]]:
        """The GPU sets worth comparing: each distinct GPU for a one-GPU share; otherwise the best-connected
        set in index order and in tightest-first order (whole free GPUs all look alike to F)."""
        if request.gpu_count == 0:
            yield ()
            return
        if request.gpu_count == 1 and not request.exclusive:
            seen: set[tuple[str, int, bool]] = set()
            for gpu in sorted(hosts, key=lambda g: g.index):
                kind = (gpu.model, gpu.free, _whole(gpu))
                if kind not in seen:
                    seen.add(kind)
                    yield (gpu,)
            return
        by_index = pick_gpus(hosts, request.gpu_count, sorted(hosts, key=lambda g: g.index))
        yield by_index
        tightest = pick_gpus(hosts, request.gpu_count, sorted(hosts, key=lambda g: (g.free, g.index)))
        if {g.index for g in tightest} != {g.index for g in by_index}:
            yield tightest

    def displacements(self, node: Node, request: PodRequest, takens: Sequence[dict[int, int]]) -> list[int]:
        """Per GPU choice of the node (``taken``: GPU index -> units), a cost added to the growth of F for placing
        ``request`` on ``node`` that way, in the same unit (memory units times ``PRECISION``). FGD itself counts
        fragmentation only."""
        return [0] * len(takens)

    def rank(self, growth: int, gpu_size: int) -> tuple[float, ...]:
        """How good a placement that grows F by ``growth`` (memory units times ``PRECISION``) is, on a node
        whose GPUs hold ``gpu_size`` units: higher is better, the first element is the node score. The
        paper's score: growth in GPUs, probabilities normalised to sum to one."""
        gpus = growth / (PRECISION * self.measure().coverage * gpu_size)
        return (float(int(SCORE_LEVELS / (1.0 + math.exp(gpus)))),)

    @staticmethod
    def _state(measure: FragmentationMeasure, node: Node, cpu_free: int, pools: tuple[Pool, ...]) -> StateKey:
        return measure.state(cpu_free if node.cpu_milli else UNLIMITED, pools)
