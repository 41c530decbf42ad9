"""Which pods to evict from one node so that a higher-priority GPU pod fits there: pure arithmetic on ``Node``.

kube-scheduler's own preemption dry run counts ``aliyun.com/gpu-mem`` per node, not per GPU: it may evict
pods whose memory lies on GPUs the preemptor cannot use, or too few on the GPU it can. Its preempt call asks
the extender which victims it agrees with on each candidate node; ``find_victims`` answers with the best set
by the rules that decide what fits everywhere else (``GPU.can_host``, ``Node.fits``), so model, count and
exclusivity constraints, compute shares, sharing rules (affinity, anti-affinity, exclusion), multi-GPU victims
and the node's CPU and memory all count: a victim set is one after which the pod is placeable by those rules.

"Best" is the fewest pods, then the lowest highest priority among them, then the lowest sum of priorities,
then the fewest PodDisruptionBudget violations. The caller counts violations from the budgets it watches
(``gpushare.disruption``, kube-scheduler's own rule); without them, what is known is kube-scheduler's count
for its own victims on the node, so a set is charged ``min(that count, how many of kube-scheduler's victims
it shares)``, an upper bound for the pods kube-scheduler judged.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations

from gpushare.contract import PodRequest
from gpushare.model import Node, Placement

# Victim sets checked exactly per node before falling back to kube-scheduler's own reprieve order. Small nodes
# (a handful of pods on the GPUs the pod can use) are searched exhaustively well within it.
MAX_EXACT_CHECKS = 4096

Chosen = Sequence[tuple[str, Placement]]
ViolationCount = Callable[[Chosen], int]
"""The PodDisruptionBudget violations of evicting these pods, given most important first."""


@dataclass(frozen=True, slots=True)
class Victim:
    key: str
    uid: str
    priority: int


@dataclass(frozen=True, slots=True)
class VictimSet:
    """The pods to evict on one node, highest priority first (kube-scheduler reads the first as the highest)."""

    victims: tuple[Victim, ...]
    pdb_violations: int


@dataclass(frozen=True, slots=True)
class Held:
    """A pod nominated to the node by an earlier preemption: its memory is spoken for there."""

    key: str
    request: PodRequest


def hold(node: Node, held: Iterable[Held]) -> Node:
    """A scratch copy of ``node`` with each nominated pod counted on the GPUs it would most likely get.

    A nominated pod has no GPUs yet; it is counted on the tightest GPUs that host it (where binpack would put
    it), or, while its victims are still leaving, on the roomiest GPUs of its model, so that the room its
    preemption freed is not handed to a pod of lower priority in the meantime.
    """
    scratch = node.copy()
    for item in sorted(held, key=lambda h: -h.request.priority):
        request = item.request
        hosts = sorted(scratch.hosts(request), key=lambda g: (g.total - g.used, g.index))
        if len(hosts) < request.gpu_count:
            hosts = sorted((g for g in scratch.gpus if g.healthy and request.models.accepts(g.model)),
                           key=lambda g: (g.used - g.total, g.index))
        placement = Placement(tuple(g.index for g in hosts[:request.gpu_count]), request.per_gpu,
                              request.compute_percent, request.exclusive, request.cpu_milli, request.memory_mib,
                              request.priority, sharing=request.sharing)
        scratch.add(item.key, placement)
    return scratch


def find_victims(node: Node, request: PodRequest, kube_victims: Collection[str] = (), kube_violations: int = 0,
                 held: Sequence[Held] = (), violations: ViolationCount | None = None) -> VictimSet | None:
    """The best set of pods below ``request.priority`` whose eviction lets the pod fit on ``node``.

    ``None`` when no such set exists (the node is vetoed) or the pod already fits (there is nothing to evict,
    and kube-scheduler must never be sent an empty victim list). ``kube_victims`` are the UIDs kube-scheduler
    proposed on this node and ``kube_violations`` its PodDisruptionBudget count for them; ``held`` are pods
    nominated to the node with at least the pod's priority; ``violations`` counts a set's PodDisruptionBudget
    violations where the caller knows the budgets.
    """
    if not request.preempts:
        return None
    base = hold(node, held) if held else node
    if base.fits(request):
        return None
    # Members of the affinity group the pod must join are never victims: evicting them can only take away the
    # GPUs it may use. Without them, evicting more never hurts, which the search below relies on.
    joining = request.sharing.affinity if request.affinity_held else ""
    candidates = [(key, p) for key, p in base.placements.items()
                  if p.uid and p.priority < request.priority and not _is_held(key, held)
                  and not (joining and p.sharing.affinity == joining)]
    if not _fits_without(base, request, [k for k, _ in candidates]):
        return None
    relevant = _relevant(base, request, candidates)
    if violations is None:
        violations = _bounded_by(frozenset(kube_victims), kube_violations)

    def rank(chosen: Chosen) -> tuple[int, int, int, int, tuple[str, ...]]:
        priorities = [p.priority for _, p in chosen]
        return (len(chosen), max(priorities), sum(priorities), violations(_most_important_first(chosen)),
                tuple(sorted(key for key, _ in chosen)))

    best: list[tuple[str, Placement]] | None = None
    checks = 0
    for size in range(1, len(relevant) + 1):
        for combo in combinations(relevant, size):
            checks += 1
            if checks > MAX_EXACT_CHECKS:
                return _result(_reprieve(base, request, relevant), violations)
            if (best is None or rank(combo) < rank(best)) and _fits_without(base, request, [k for k, _ in combo]):
                best = list(combo)
        if best is not None:
            return _result(best, violations)
    # Not reached: evicting every relevant candidate lets the pod fit (checked above), so some size found a set.
    return _result(relevant, violations)


def _is_held(key: str, held: Sequence[Held]) -> bool:
    return any(h.key == key for h in held)


def _relevant(node: Node, request: PodRequest,
              candidates: list[tuple[str, Placement]]) -> list[tuple[str, Placement]]:
    """The candidates whose eviction can matter, lowest priority first (so cheaper sets are tried first).

    Pods only on GPUs the pod could never use free nothing it needs, unless the node is short of CPU or memory.
    """
    if node.fits_host_resources(request):
        usable = {g.index for g in node.gpus if g.healthy and request.models.accepts(g.model)
                  and g.total >= request.per_gpu}
        candidates = [(k, p) for k, p in candidates if usable.intersection(p.gpu_indices)]
    return sorted(candidates, key=lambda c: (c[1].priority, c[0]))


def _reprieve(node: Node, request: PodRequest,
              candidates: list[tuple[str, Placement]]) -> list[tuple[str, Placement]]:
    """kube-scheduler's SelectVictimsOnNode order: evict all, then give back the highest priority first while
    the pod still fits. The set is irreducible, though not always the smallest."""
    victims = list(candidates)
    for item in sorted(candidates, key=lambda c: (-c[1].priority, c[0])):
        rest = [c for c in victims if c is not item]
        if _fits_without(node, request, [k for k, _ in rest]):
            victims = rest
    return victims


def _bounded_by(kube: frozenset[str], kube_violations: int) -> ViolationCount:
    def count(chosen: Chosen) -> int:
        return min(kube_violations, sum(1 for _, p in chosen if p.uid in kube))

    return count


def _most_important_first(chosen: Chosen) -> list[tuple[str, Placement]]:
    """kube-scheduler's MoreImportantPod order (priority, then the key where it would compare start times)."""
    return sorted(chosen, key=lambda c: (-c[1].priority, c[0]))


def _result(chosen: Chosen, violations: ViolationCount) -> VictimSet:
    ordered = _most_important_first(chosen)
    return VictimSet(tuple(Victim(key, p.uid, p.priority) for key, p in ordered), violations(ordered))


def _fits_without(node: Node, request: PodRequest, removed: Iterable[str]) -> bool:
    """Whether the pod fits once the pods ``removed`` are gone, judged by ``Node.fits`` on a scratch copy."""
    scratch = node.copy()
    for key in removed:
        scratch.remove(key)
    return scratch.fits(request)
