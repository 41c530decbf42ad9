"""Placing a gang's pending pods at once: a pure function of node states and the members' requests.

The extender holds what a plan places for the whole gang in one step, so a plan must be all the members it
needs or nothing. Exact placement of many pods is bin packing (NP-hard); the planner places the largest
members first, each on the node its own policy prefers among the copies it has filled so far, and skips a
member that no longer fits. It can report "does not fit" for a gang some cleverer packing would place; it
never reports a plan that overfills a GPU, since every step goes through ``Node.place``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from gpushare.contract import PodRequest
from gpushare.model import Node, state_signature
from gpushare.policies.base import Candidate, node_priority

Evaluate = Callable[[Node, PodRequest], Candidate | None]
"""A member's policy asked about one node: the best GPUs there, or ``None`` when it does not fit."""


@dataclass(frozen=True, slots=True)
class Member:
    """A pending member to place: its pod key and request, and its policy's ``evaluate``."""

    key: str
    request: PodRequest
    evaluate: Evaluate


@dataclass(frozen=True, slots=True)
class Placed:
    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class GangPlan:
    """Where each placed member goes; ``placed`` is empty when fewer than ``need`` members fit at once."""

    placed: dict[str, Placed]
    fitted: int
    """How many members fitted at once, which may be fewer than needed: the sentence for the user reads it."""


def plan_gang(nodes: Sequence[Node], members: Sequence[Member], need: int, seed: int = 0) -> GangPlan:
    """Place as many of ``members`` as fit on ``nodes`` together, largest first; a plan only if at least ``need``.

    ``nodes`` are not changed. Ties between nodes of equal score go to ``node_priority``, as everywhere else.
    Each node is judged once per distinct (evaluate, request shape), nodes in equal states once in all, and after
    a placement only the node that changed again: members of a gang mostly share one shape, so a gang costs about
    one policy pass over the nodes, not one per member.
    """
    copies = {n.name: n.copy() for n in nodes}
    order = sorted(members, key=lambda m: (-m.request.total, -m.request.gpu_count, m.key))
    judged: dict[Hashable, tuple[Member, dict[str, Candidate | None]]] = {}
    placed: dict[str, Placed] = {}
    for member in order:
        kind = (member.evaluate, _shape(member.request))  # bound methods of one policy compare equal
        if kind not in judged:
            by_state: dict[Hashable, Candidate | None] = {}
            candidates: dict[str, Candidate | None] = {}
            for name, node in copies.items():
                state = state_signature(node)
                if state not in by_state:
                    by_state[state] = member.evaluate(node, member.request)
                candidates[name] = by_state[state]
            judged[kind] = (member, candidates)
        candidates = judged[kind][1]
        best: tuple[float, int, str, Candidate] | None = None
        for name, candidate in candidates.items():
            if candidate is None:
                continue
            rank = (candidate.score, node_priority(name, seed))
            if best is None or rank > best[:2]:
                best = (rank[0], rank[1], name, candidate)
        if best is None:
            continue
        node, candidate = copies[best[2]], best[3]
        try:
            node.place(member.key, member.request, candidate.gpus)
        except ValueError:  # a policy that proposed GPUs without room: the member does not fit there
            candidates[node.name] = None
            continue
        placed[member.key] = Placed(node.name, candidate.gpus)
        for judge, table in judged.values():  # only this node changed
            table[node.name] = judge.evaluate(node, judge.request)
    if len(placed) < need:
        return GangPlan({}, len(placed))
    return GangPlan(placed, len(placed))


def _shape(request: PodRequest) -> Hashable:
    """Everything about a request that a policy's placement reads."""
    return (request.per_gpu, request.gpu_count, request.exclusive, request.compute_percent, request.models,
            request.cpu_milli, request.memory_mib)
