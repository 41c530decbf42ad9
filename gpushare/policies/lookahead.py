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

from gpushare.contract import PodRequest
from gpushare.model import Node
from gpushare.policies.base import Candidate
from gpushare.policies.fgd import (
    PRECISION,
    SCORE_LEVELS,
    FragmentationGradient,
    FragmentationMeasure,
    Pool,
    SharedSides,
    StateKey,
    Weights,
    rank_right,
)
from gpushare.policies.workload import Target, WorkloadDistribution

# Growth is compared in steps of this fraction of the largest per-GPU share in the target workload.
STEP_FRACTION = 10


class CapacityMeasure(FragmentationMeasure):
    """The lookahead fragmentation measure (see the module docstring)."""

    def __init__(self, target: Target, shared: SharedSides) -> None:
        super().__init__(target, shared)
        largest = max((s.per_gpu for s, _ in target if s.gpu_count), default=0)
        # Growth is compared at this resolution (memory units times PRECISION; 0: exactly).
        self.step = largest * PRECISION // STEP_FRACTION
        # Unlike FGD's, this F depends on the exact free CPU (how many copies it feeds). It is summed per demand,
        # its shapes ordered by CPU: those needing no CPU, and those the node has the CPU for at every copy its GPUs
        # could take, use all the memory they can, those it has no CPU for use none, and only those in between are
        # worked out one by one; the demands' GPU side is worked out once per set of pools (``gpu_side``). A loop
        # over every shape of the target per call made a policy's fresh evaluation of a node twice as slow for the
        # same F (openb's gpuspec20, 366 shapes, 60% full, memos empty: 115 against 51 us).
        self._cpu_only_weights = Weights.of(self.cpu_only)
        # Per demand's number: the weight of its shapes that need no CPU; the CPU of the others, ascending, with the
        # running sum of their weights and each one's weight.
        plan = []
        for shapes in self.demand_shapes:
            needing = sorted((cpu, w) for cpu, w in shapes if cpu > 0)
            by_cpu = Weights.of(needing)
            plan.append((sum(w for cpu, w in shapes if cpu <= 0), by_cpu.keys, by_cpu.below,
                         tuple(w for _, w in needing)))
        self._plan = self.by_number(plan)

    def state(self, cpu_free: int, pools: tuple[Pool, ...]) -> StateKey:
        return (cpu_free, pools)

    def scale(self, cpu: int) -> int:
        # All the idle memory is fragment for every shape, less what each could use: nothing for the shapes that need
        # no GPU and have the CPU (they are the ones the bisection counts off).
        keys, below = self._cpu_only_weights.keys, self._cpu_only_weights.below
        return self.weight - below[rank_right(keys, cpu)]

    def linear(self, cpu: int) -> tuple[int, ...] | None:
        return None  # what a demand's shapes use depends on its copies too

    def term(self, cpu: int, number: int, usable: int, copies: int, per_copy: int) -> int:
        # All that is usable for the demand's shapes that need no CPU and for those the node has the CPU for at every
        # copy, what those needing more could use. Compiled, on machine integers: written as an iterator of four and
        # C-level maps over boxed ints, this measure (its GPU sides included) took a fifth of a filter (gpuspec20's pods
        # on openb's fleet) and a quarter of a policy's fresh evaluation.
        shapes = self._plan[number]
        if shapes is None:  # no shape of the target wants it
            return 0
        no_cpu_weight, keys, below, weights = shapes
        fed = rank_right(keys, cpu // copies)
        # Those after, up to the CPU the node has, feed cpu // CPU copies of per_copy each: fewer than ``copies``, which
        # never use more than is usable, so these use no more either. On a cluster with room this is most shapes (a few
        # cores feed every copy of a small share).
        fed_partly = 0
        for j in range(fed, len(keys)):
            needed = keys[j]
            if needed > cpu:
                break
            fed_partly += weights[j] * (cpu // needed)
        return usable * (no_cpu_weight + below[fed]) + per_copy * fed_partly


class FragmentationLookahead(FragmentationGradient):
    """FGD with the lookahead measure: place where the expected future capacity shrinks least, comparing
    growth in steps (ties: FGD's score for one-GPU shares, then node priority)."""

    name = "fgd-lookahead"
    measure_type = CapacityMeasure

    def __init__(self, workload: WorkloadDistribution | None = None) -> None:
        super().__init__(workload)
        self._fgd = FragmentationGradient(self.workload, self.sides)  # the same target: the same GPU sides

    def evaluate(self, node: Node, request: PodRequest) -> Candidate | None:
        if not node.fits_host_resources(request):
            return None
        view = self.gpu_choices(node, request)
        if view is None:
            return None
        tie_break = request.gpu_count == 1 and not request.exclusive and request.per_gpu < view.largest
        candidate = self.best(node, request, view, self._fgd.measure() if tie_break else None)
        if candidate is None or not tie_break:
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
