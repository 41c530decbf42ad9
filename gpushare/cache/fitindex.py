"""The fit index: whether a request shape fits a node, judged once per node state.

kube-scheduler sends the same node names with every pod, most nodes do not change between two pods, and large
clusters hold many nodes in identical states (empty ones, full ones). So filter looks each name up once for its
node's state, and answers from a per-shape table of states judged before; only a state the shape has not met
is judged, on the immutable ``NodeSummary`` its node published.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpushare.contract import PodRequest
from gpushare.model import Node

UNBOUNDED = 1 << 62


@dataclass(frozen=True, slots=True)
class NodeSummary:
    """What filter needs to judge a plain request without touching the node."""

    cpu_free: int
    memory_free: int
    frees: tuple[int, ...]  # free units of each GPU a shared pod could still use, largest first
    gpus: tuple[tuple[str, int, int, bool], ...]  # (model, free, compute used, nobody holds it) per open GPU


@dataclass(slots=True)
class FilterOutcome:
    passed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)
    """Nodes that fail, not worded because some node passed (see ``ClusterCache.filter``)."""
    passed_states: list[int | None] | None = None
    """The cache's state number of each of ``passed``, in order, where the filter read them; for scoring the same
    nodes with ``ClusterCache.evaluate_states`` without looking every name up again."""
    passed_counts: dict[int | None, int] | None = None
    """With ``passed_states``: how many of ``passed`` each of their states holds, the states in the order they first
    appear (``ClusterCache.favourite`` counts the best states' names with it)."""
    passed_firsts: dict[int | None, str] | None = None
    """With ``passed_states``: the first of ``passed`` in each of their states, the states in the same order
    (``ClusterCache.evaluate_states`` reads a state it has no answer for on that node)."""


def read_window(names: list[str], node_states: dict[str, int], table: dict[int, bool]
                ) -> tuple[list[int | None], list[bool | None], bool]:
    """Per name, its node's state number (``None``: no node the cache holds) and whether the shape fits that state
    as ``table`` remembers it (``None``: not judged yet); and whether some name is left to judge.

    One compiled pass instead of one C-level pass per list: a window of 500 names cost 68-71 us split that way and
    53-57 us with ``sort_window``, of which 29-31 us are the state lookups themselves (the request's names are
    strings of its own, compared with the cache's in memory the last window left cold).
    """
    states: list[int | None] = []
    fits: list[bool | None] = []
    unjudged = False
    for name in names:
        state = node_states.get(name)
        fit = None if state is None else table.get(state)
        unjudged = unjudged or fit is None
        states.append(state)
        fits.append(fit)
    return states, fits, unjudged


def judge_window(states: list[int | None], fits: list[bool | None], table: dict[int, bool],
                 summaries: dict[int, NodeSummary], check: Callable[[NodeSummary], bool]) -> tuple[list[int], int]:
    """Fill in ``fits`` where ``read_window`` left ``None``, judging each state the shape has not met once, on the
    summary of that state, and remembering the answer in ``table``; the indices left (no state, or no summary: a
    state that ended since the window was read), and how many answers ``table`` gained.

    With every pod a shape of its own (its own CPU, or its own GPU share) every name of the window is left to judge,
    and their states (60 distinct in 450 names, gpuspec20's pods with their CPU spread on openb's fleet) were judged
    under each node's lock, 94 us a filter.
    """
    left: list[int] = []
    added = 0
    for i in range(len(fits)):
        if fits[i] is not None:
            continue
        state = states[i]
        if state is None:
            left.append(i)
            continue
        fit = table.get(state)  # judged for an earlier name of this window
        if fit is None:
            summary = summaries.get(state)
            if summary is None:
                left.append(i)
                continue
            fit = table[state] = check(summary)
            added += 1
        fits[i] = fit
    return left, added


def sort_window(names: list[str], states: list[int | None], fits: list[bool | None]
                ) -> tuple[list[str], list[str], list[int | None], dict[int | None, int], dict[int | None, str]]:
    """The names that fit and those that do not, in order, the states of the first, how many of them each of those
    states holds and the first of them in each (in the order the states first appear), in one pass; ``fits`` has
    no ``None`` left."""
    passed: list[str] = []
    failing: list[str] = []
    passed_states: list[int | None] = []
    counts: dict[int | None, int] = {}
    firsts: dict[int | None, str] = {}
    for i in range(len(names)):
        name = names[i]
        if fits[i]:
            state = states[i]
            passed.append(name)
            passed_states.append(state)
            count = counts.get(state, 0)
            if not count:
                firsts[state] = name
            counts[state] = count + 1
        else:
            failing.append(name)
    return passed, failing, passed_states, counts, firsts


def shape_key(request: PodRequest) -> tuple[Any, ...]:
    """What a request's fit and scores depend on. The CPU request comes last, so that ``key[:-1]`` is the same for
    requests that differ only in it (scores found from each other's: ``Bracket``)."""
    return (request.per_gpu, request.gpu_count, request.exclusive, request.compute_percent, request.models,
            request.memory_mib, request.sharing, request.affinity_held, request.cpu_milli)


def summarise(node: Node) -> NodeSummary:
    """The node as ``GPU.can_host`` and ``Node.fits_host_resources`` see it, in plain tuples.

    Only for pods without sharing values (the cache judges the others on the full state): such pods never join
    a GPU that holds a pod with an exclusion value.
    """
    open_gpus = [g for g in node.gpus if g.healthy and not g.exclusive and not g.exclusion]
    usable = [g for g in open_gpus if g.compute_used <= 100]
    return NodeSummary(
        cpu_free=node.cpu_milli - node.cpu_used if node.cpu_milli else UNBOUNDED,
        memory_free=node.memory_mib - node.memory_used if node.memory_mib else UNBOUNDED,
        frees=tuple(sorted((g.total - g.used for g in usable), reverse=True)),
        gpus=tuple((g.model, g.total - g.used, g.compute_used, g.holders == 0 and g.used == 0) for g in open_gpus),
    )


def fit_check(request: PodRequest) -> Callable[[NodeSummary], bool]:
    """Whether a node with this summary admits the request: the same answer as ``Node.fits``."""
    per_gpu, need, cpu, memory = request.per_gpu, request.gpu_count, request.cpu_milli, request.memory_mib
    compute, exclusive, models = request.compute_percent, request.exclusive, request.models
    if not compute and not models.include and not models.exclude and not exclusive:
        k = need - 1
        return lambda s: s.cpu_free >= cpu and s.memory_free >= memory and len(s.frees) > k and s.frees[k] >= per_gpu

    # Whether the request accepts each model met, asked once per model: a fleet has a few, and a filter late in a
    # full cluster judges hundreds of states, each of whose GPUs ``ModelRule.accepts`` would lower-case and look up
    # (a filter's judging 474 us against 197 for a pod without a model rule, 15,000 of openb's nodes, 40,000 pods).
    accepted: dict[str, bool] = {}

    def check(s: NodeSummary) -> bool:
        if s.cpu_free < cpu or s.memory_free < memory:
            return False
        hosts = 0
        for model, free, compute_used, idle in s.gpus:
            accepts = accepted.get(model)
            if accepts is None:
                accepts = accepted[model] = models.accepts(model)
            if not accepts:
                continue
            # An idle GPU's free memory is its total: an exclusive pod needs one at least as big as its share.
            if idle and free >= per_gpu if exclusive else free >= per_gpu and compute_used + compute <= 100:
                hosts += 1
        return hosts >= need

    return check


