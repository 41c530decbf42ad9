"""Placing a gang's pending pods at once: a pure function of node states and the members' requests.

The extender holds what a plan places for the whole gang in one step, so a plan must be all the members it
needs or nothing. Exact placement of many pods is bin packing (NP-hard); the planner places the largest
members first, each on the node its own policy prefers among the copies it has filled so far, and skips a
member that no longer fits. It can report "does not fit" for a gang some cleverer packing would place; it
never reports a plan that overfills a GPU, since every step goes through ``Node.place``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from gpushare.contract import PodRequest
from gpushare.model import Node
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


def copy_node(node: Node) -> Node:
    """A copy that planning may fill without touching the cache's node."""
    return replace(node, gpus=[replace(g) for g in node.gpus], placements=dict(node.placements))


def plan_gang(nodes: Sequence[Node], members: Sequence[Member], need: int, seed: int = 0) -> GangPlan:
    """Place as many of ``members`` as fit on ``nodes`` together, largest first; a plan only if at least ``need``.

    ``nodes`` are not changed. Ties between nodes of equal score go to ``node_priority``, as everywhere else.
    """
    copies = [copy_node(n) for n in nodes]
    order = sorted(members, key=lambda m: (-m.request.total, -m.request.gpu_count, m.key))
    placed: dict[str, Placed] = {}
    for member in order:
        best: tuple[float, int, Node, Candidate] | None = None
        for node in copies:
            candidate = member.evaluate(node, member.request)
            if candidate is None:
                continue
            key = (candidate.score, node_priority(node.name, seed))
            if best is None or key > best[:2]:
                best = (key[0], key[1], node, candidate)
        if best is None:
            continue
        node, candidate = best[2], best[3]
        try:
            node.place(member.key, member.request, candidate.gpus)
        except ValueError:  # a policy that proposed GPUs without room: the member does not fit there
            continue
        placed[member.key] = Placed(node.name, candidate.gpus)
    if len(placed) < need:
        return GangPlan({}, len(placed))
    return GangPlan(placed, len(placed))
