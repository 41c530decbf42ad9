"""FGD that looks past the next task: how many of each expected task could the node still take?

FGD's measure asks whether one more task of shape m fits on a node. It does not see a node running out of
CPU before its GPUs: taking 12 cores from a node with 40 cores and 4 idle GPUs changes nothing for FGD
(every shape still fits once), yet the node can now host two 11-core one-GPU tasks instead of three, and
one GPU is stranded. In the openb trace this is where most of the GPU is lost: CPU-only pods and CPU-heavy
pods land on GPU-dense nodes and leave whole GPUs without cores, while CPU-rich nodes keep cores spare.

The lookahead measure counts, for each target shape m, how many copies k of m the node could still host
(limited by its GPUs and by its free CPU) and calls fragment all idle GPU memory those k copies could not
use: everything when k = 0, FGD's fragment when the GPUs are the limit, and idle - k x (m's GPU memory)
when the CPU runs out first. Placing a pod then costs what it takes from every future task, CPU included.
CPU-only shapes are counted as in FGD (all idle GPU memory is fragment when they no longer fit).

Growth is compared in steps of a tenth of the largest per-GPU share in the target workload (100 units, a
tenth of a GPU, in the openb trace). Smaller differences are below what an estimate of the future workload
can tell apart; treating them as ties hands the choice to the node priority, a fixed order that keeps
filling the same nodes first and leaves the others whole (on the openb trace this is worth 0.07 to 0.48
points of unallocated GPU over exact comparison, most on the multi-GPU variant; see docs/policies.md).
For a pod that shares one GPU, ties go first to FGD's own score, which sees which card's leftover the next
tasks can use; whole-GPU, multi-GPU and CPU-only pods leave ties to node priority, which keeps whole nodes
whole for multi-GPU tasks.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import repeat
from operator import floordiv, mul

from gpushare.contract import PodRequest
from gpushare.model import Node
from gpushare.policies.base import Candidate
from gpushare.policies.fgd import (
    PRECISION,
    SCORE_LEVELS,
    FragmentationGradient,
    FragmentationMeasure,
    Pool,
    StateKey,
    Weights,
)
from gpushare.policies.workload import Target, WorkloadDistribution

# GPU-side facts for one set of pools: its idle memory; the memory that the shapes needing no CPU would use; and per
# GPU demand (GPU count, share, exclusive, model rule) of which a copy fits, four numbers in a row: the demand's
# number, the GPU memory it could use, how many copies of it the GPUs could take, and the memory one copy takes. Model
# rules leave most demands without a copy on a node: only the others are summed per call. One flat tuple an entry,
# not a tuple per demand: the memo holds up to ``_GPU_MEMO_LIMIT`` of them. An entry takes 1.5 kB (openb's default
# trace) to 3 kB (gpuspec20); one target's memo held at most 1,900 sets of pools in the replays and 5,749 at 15,000
# nodes with 60,000 pods bound, so the limit leaves room for more varied fleets and keeps the memo under 60 MB.
_GPUSide = tuple[int, int, tuple[int, ...]]
_GPU_MEMO_LIMIT = 20_000
# Growth is compared in steps of this fraction of the largest per-GPU share in the target workload.
STEP_FRACTION = 10


class CapacityMeasure(FragmentationMeasure):
    """The lookahead fragmentation measure (see the module docstring)."""

    def __init__(self, target: Target) -> None:
        super().__init__(target)
        largest = max((s.per_gpu for s, _ in target if s.gpu_count), default=0)
        # Growth is compared at this resolution (memory units times PRECISION; 0: exactly).
        self.step = largest * PRECISION // STEP_FRACTION
        # Unlike FGD's, this F depends on the exact free CPU (how many copies it feeds). It is summed per demand,
        # its shapes ordered by CPU: those the node has the CPU for at every copy its GPUs could take use all the
        # memory they can, those it has no CPU for use none, and only those in between are worked out one by one;
        # what the shapes needing no CPU use is summed once per set of pools (``_gpu_side``). A loop over every shape
        # of the target per call made a policy's fresh evaluation of a node twice as slow for the same F (openb's
        # gpuspec20, 366 shapes, 60% full, memos empty: 115 against 51 us).
        self._cpu_only_weights = Weights.of(self.cpu_only)
        # Per demand: the weight of its shapes that need no CPU; the CPU of the others, ascending, with the running
        # sum of their weights and each one's weight.
        plan = []
        for shapes in self.demand_shapes:
            needing = sorted((cpu, w) for cpu, w in shapes if cpu > 0)
            by_cpu = Weights.of(needing)
            plan.append((sum(w for cpu, w in shapes if cpu <= 0), by_cpu.keys, by_cpu.below,
                         tuple(w for _, w in needing)))
        self._plan = tuple(plan)
        self._gpu_memo: dict[tuple[Pool, ...], _GPUSide] = {}

    def state(self, cpu_free: int, pools: tuple[Pool, ...]) -> StateKey:
        return (cpu_free, pools)

    def amount(self, state: StateKey) -> int:
        cpu_free, pools = state
        idle, used_without_cpu, hosted = self._gpu_side(pools)
        if idle == 0:
            return 0
        # All the idle memory is fragment for every shape, less what each could use: nothing for the shapes that
        # need no GPU and have the CPU (they are the ones the bisection counts off), all that is usable for those
        # that need no CPU, and below, per demand some copy of fits, what the shapes needing CPU could use.
        keys, below = self._cpu_only_weights.keys, self._cpu_only_weights.below
        total = idle * (self.weight - below[bisect_right(keys, cpu_free)]) - used_without_cpu
        plan = self._plan
        numbers = iter(hosted)
        for demand, usable, copies, per_copy in zip(numbers, numbers, numbers, numbers, strict=True):
            _, keys, below, weights = plan[demand]
            # The shapes with the CPU for every copy use all that is usable.
            fed = bisect_right(keys, cpu_free // copies)
            total -= usable * below[fed]
            # Those after, up to the CPU the node has, feed cpu_free // CPU copies of per_copy each: fewer than
            # ``copies``, which never use more than is usable, so these use no more either. On a cluster with room
            # this is most shapes (a few cores feed every copy of a small share), summed in one C-level pass.
            starved = bisect_right(keys, cpu_free, fed)
            if starved > fed:
                total -= per_copy * sum(map(mul, weights[fed:starved], map(floordiv, repeat(cpu_free),
                                                                           keys[fed:starved])))
        return total

    def _gpu_side(self, pools: tuple[Pool, ...]) -> _GPUSide:
        found = self._gpu_memo.get(pools)
        if found is not None:
            return found
        used_without_cpu = 0
        hosted: list[int] = []
        accepted = [(self.accepts(model), frees, wholes) for model, frees, wholes in pools]
        for i, ((count, per_gpu, exclusive, _), (no_cpu_weight, _, _, _)) in enumerate(
                zip(self.demands, self._plan, strict=True)):
            usable = copies = hosts = 0
            for accepts, frees, wholes in accepted:
                if not accepts[i]:
                    continue
                if exclusive:
                    hosts += len(wholes)
                    usable += sum(wholes)
                    continue
                room = frees[bisect_left(frees, per_gpu):]
                hosts += len(room)
                usable += sum(room)
                if count == 1 and per_gpu > 0:
                    copies += sum(free // per_gpu for free in room)
            if count != 1 or per_gpu <= 0 or exclusive:
                copies = hosts // count if count else 0
            if copies <= 0:  # not one copy fits: its shapes use nothing
                continue
            used_without_cpu += usable * no_cpu_weight
            # Never more than usable / copies: each copy takes its share of the GPUs counted in ``usable``.
            per_copy = per_gpu * count if per_gpu > 0 and not exclusive else (usable // hosts * count if hosts else 0)
            hosted.extend((i, usable, copies, per_copy))
        if len(self._gpu_memo) >= _GPU_MEMO_LIMIT:
            self._gpu_memo.clear()
        idle = sum(sum(frees) for _, frees, _ in pools)
        result = self._gpu_memo[pools] = (idle, used_without_cpu, tuple(hosted))
        return result


class FragmentationLookahead(FragmentationGradient):
    """FGD with the lookahead measure: place where the expected future capacity shrinks least, comparing
    growth in steps (ties: FGD's score for one-GPU shares, then node priority)."""

    name = "fgd-lookahead"
    measure_type = CapacityMeasure

    def __init__(self, workload: WorkloadDistribution | None = None) -> None:
        super().__init__(workload)
        self._fgd = FragmentationGradient(self.workload)

    def evaluate(self, node: Node, request: PodRequest) -> Candidate | None:
        if not node.fits_host_resources(request):
            return None
        view = self.gpu_choices(node, request)
        if view is None:
            return None
        candidate = self.best(node, request, view)
        if candidate is None or request.gpu_count != 1 or request.exclusive or request.per_gpu >= view.largest:
            return candidate
        fgd = self._fgd.best(node, request, view)
        if fgd is None:
            return candidate
        # Within half a step, so that it only orders placements whose rounded growth ties.
        step = self._step() / PRECISION
        return Candidate(candidate.score + fgd.score / (SCORE_LEVELS + 1) * step / 2, candidate.gpus)

    def _step(self) -> int:
        measure = self.measure()
        return measure.step if isinstance(measure, CapacityMeasure) else 0

    def rank(self, growth: int, gpu_size: int) -> tuple[float, ...]:
        """Minus the growth in memory units rounded to the measure's step (the node score; ties go to node
        priority), then the exact growth (which GPUs to take on the node)."""
        step = self._step()
        rounded = growth if step <= 0 else (2 * growth + step) // (2 * step) * step
        return (-rounded / PRECISION, -growth / PRECISION)
