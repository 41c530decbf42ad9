"""What every policy provides, and how node scores become a decision."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations, compress, groupby, repeat
from operator import eq, is_not
from typing import Protocol, TypeGuard, TypeVar, cast, runtime_checkable

from gpushare.contract import PodRequest
from gpushare.model import GPU, Node

MAX_EXTENDER_SCORE = 10

S = TypeVar("S", bound=Hashable)

# Beyond this many candidate GPU sets a multi-GPU pod's topology search keeps only the tightest GPUs.
MAX_TOPOLOGY_COMBINATIONS = 256


@dataclass(frozen=True, slots=True)
class Candidate:
    """A feasible placement of a pod on one node: higher ``score`` is better."""

    score: float
    gpus: tuple[int, ...]


class Policy(Protocol):
    name: str

    def evaluate(self, node: Node, request: PodRequest) -> Candidate | None:
        """The best placement of ``request`` on ``node``, or ``None`` if it does not fit.

        ``None`` exactly when ``node.fits(request)`` is false: whether a pod fits is a fact of the node and the
        request, never of what the policy has learned, so callers may keep it across ``version`` changes. The
        request's memory is read only for that (``Node.fits_host_resources``): where the pod fits, its score and
        GPUs are those of the same request without memory, so callers may share them between such requests. Nor
        does the score rise with the request's CPU, the rest alike (more CPU taken leaves a node less for what comes
        next): where two CPU requests score the same, every request between them scores that, and none below the
        smaller scores less, so callers may answer those without evaluating (``Bracket``)."""
        ...

    def observe(self, request: PodRequest) -> None:
        """Learn from a pod the scheduler has seen (policies that model the workload use it)."""
        ...


@runtime_checkable
class InventoryAware(Protocol):
    """A policy that weighs GPUs by how much of the cluster's capacity their model is."""

    def observe_inventory(self, capacity: Mapping[str, int]) -> None:
        """The cluster's GPU memory per model (healthy GPUs, memory units), whenever it may have changed."""
        ...


@runtime_checkable
class ClusterAware(Protocol):
    """A policy that weighs a placement by what the rest of the cluster still has free."""

    def observe_nodes(self, nodes: Iterable[Node], gone: Iterable[str] = ()) -> None:
        """The nodes whose state may have changed since the last call (every node on the first), and the names
        of nodes that left the cluster."""
        ...


@runtime_checkable
class Repricing(Protocol):
    """A policy whose ``version`` (``policy_version``) also changes with prices that only some nodes' answers
    depend on."""

    def unchanged_since(self, version: int, node: Node) -> bool:
        """Whether ``evaluate`` answers for ``node`` (in its present state) now as it did while ``version`` was
        current, so that an answer remembered then still holds."""
        ...


@runtime_checkable
class ClassedShares(Protocol):
    """A policy that weighs a one-GPU share (one GPU, not exclusive) by its class: on a node, such a request's score
    depends on its exact share only through the GPUs that share fits, and is the best over those GPUs, so a larger
    share of the same class, which fits no more of them, never scores higher."""

    def share_class(self, per_gpu: int) -> int:
        """The class of a one-GPU share of ``per_gpu`` units: what the policy weighs in its place."""
        ...


def follows_inventory(policy: Policy) -> TypeGuard[InventoryAware]:
    """Whether the policy is ``InventoryAware``; decided once per class, since a runtime protocol check walks the
    protocol's members on every call and prioritize asks for every pod."""
    return _implements(type(policy), InventoryAware)


def follows_cluster(policy: Policy) -> TypeGuard[ClusterAware]:
    """Whether the policy is ``ClusterAware``; decided once per class, as ``follows_inventory``."""
    return _implements(type(policy), ClusterAware)


def reprices(policy: Policy) -> TypeGuard[Repricing]:
    """Whether the policy is ``Repricing``; decided once per class, as ``follows_inventory``."""
    return _implements(type(policy), Repricing)


@functools.cache
def _implements(kind: type, protocol: type) -> bool:
    return issubclass(kind, protocol)


def classes_shares(policy: Policy) -> TypeGuard[ClassedShares]:
    """Whether the policy is ``ClassedShares``; decided once per class, as ``follows_inventory``."""
    return _implements(type(policy), ClassedShares)


def policy_version(policy: object) -> int:
    """Policies that learn expose ``version``; it changes whenever their answers may change (0 for the rest)."""
    version = getattr(policy, "version", 0)
    return version if isinstance(version, int) else 0


def node_priority(name: str, seed: int = 0) -> int:
    """A fixed pseudo-random priority per node and seed: how ties between equal scores are broken.

    The trace replay and the extender use the same function, so both make the same choices.
    """
    return _tie_breaks(seed)[name]


def _hashed_priority(name: str, seed: int) -> int:
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class _TieBreaks(dict[str, int]):
    """``node_priority`` of one seed, computed once per name.

    Prioritize breaks ties among hundreds of equal nodes per pod (empty nodes score alike), the same names pod
    after pod: a hit is a C-level dict lookup. Bounded for clusters whose nodes come and go: past
    ``MAX_TIE_BREAKS`` names it starts again.
    """

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.seed = seed

    def __missing__(self, name: str) -> int:
        if len(self) >= MAX_TIE_BREAKS:
            self.clear()
        priority = self[name] = _hashed_priority(name, self.seed)
        return priority


MAX_TIE_BREAKS = 1 << 16


@functools.cache
def _tie_breaks(seed: int) -> _TieBreaks:
    return _TieBreaks(seed)


def choose_node(nodes: Iterable[Node], request: PodRequest, policy: Policy,
                seed: int = 0) -> tuple[Node, Candidate] | None:
    """The node and GPUs the policy prefers, ties broken by ``node_priority``."""
    best: tuple[float, int, Node, Candidate] | None = None
    for node in nodes:
        candidate = policy.evaluate(node, request)
        if candidate is None:
            continue
        key = (candidate.score, node_priority(node.name, seed))
        if best is None or key > best[:2]:
            best = (key[0], key[1], node, candidate)
    return None if best is None else (best[2], best[3])


def favourite(scores: Mapping[str, float], seed: int = 0) -> str:
    """The name with the highest score, ties broken by ``node_priority``: the node the policy places the pod on
    (the one ``extender_scores`` gives the top score). ``scores`` must not be empty."""
    names = list(scores)
    best = favourite_of_states(names, names, scores, seed)  # each name its own state
    if best is None:
        raise ValueError("favourite() needs at least one score")
    return best


def favourite_of_states(names: Iterable[str], states: Iterable[S], scores: Mapping[S, float | None],
                        seed: int = 0) -> str | None:
    """``favourite`` of ``names``, each in the state of the same position in ``states``, scored per state
    (``None``: a node in that state does not fit); ``None`` if none fits.

    Prioritize asks this (through ``favourite``) for hundreds of names that are their own states: C-level passes,
    over the states and then once over the names to find those in the best states. Filter's windows share a
    handful of states, and ``ClusterCache.favourite`` finds the same node from each state's ranked nodes.
    """
    best = best_states(scores)
    if not best:
        return None
    return highest_priority(compress(names, map(best.__contains__, states)), seed)


def best_states(scores: Mapping[S, float | None]) -> set[S]:
    """The states of ``scores`` with the highest score (``None``: a node in that state does not fit); empty if
    none fits. The favourite is the node of these that ``node_priority`` ranks highest."""
    values = scores.values()
    fitting = list(filter(_is_score, values))
    if not fitting:
        return set()
    high = max(cast(list[float], fitting))
    return set(compress(scores, map(eq, values, repeat(high))))


def highest_priority(names: Iterable[str], seed: int = 0) -> str:
    """The name ``node_priority`` ranks highest: the tie-break among equal scores. ``names`` must not be empty."""
    return max(names, key=_tie_breaks(seed).__getitem__)


_is_score = functools.partial(is_not, None)


def extender_scores(scores: Mapping[str, float], seed: int = 0) -> dict[int, list[str]]:
    """Map raw policy scores onto 0..10 so that kube-scheduler still picks the policy's favourite: each extender
    score with the names of the nodes that get it.

    kube-scheduler sums integer scores and breaks ties at random, which would turn a fine-grained ranking
    into a lottery among all nodes that round to 10. So only the single best node (ties broken by
    ``node_priority``) gets 10; the others are spread over 0..9 by their raw score.
    """
    if not scores:
        return {}
    low, high = min(scores.values()), max(scores.values())
    # Prioritize asks this for hundreds of nodes per pod, in few distinct scores: C-level passes over the names,
    # Python work only per distinct score. The answer is grouped by score, so that the wire format is written
    # per group too.
    best = favourite(scores, seed)
    span = high - low
    out: dict[int, list[str]] = {}
    for raw, names in groupby(sorted(scores, key=scores.__getitem__), key=scores.__getitem__):
        level = MAX_EXTENDER_SCORE - 1 if span <= 0 else min(int((raw - low) / span * (MAX_EXTENDER_SCORE - 1)),
                                                              MAX_EXTENDER_SCORE - 1)
        out.setdefault(level, []).extend(names)
    runners_up = out[MAX_EXTENDER_SCORE - 1]  # the highest raw score always maps to 9
    runners_up.remove(best)
    if not runners_up:
        del out[MAX_EXTENDER_SCORE - 1]
    out[MAX_EXTENDER_SCORE] = [best]
    return out


def topology_score(gpus: Sequence[GPU]) -> int:
    """HAMi's score for a set of GPUs: the sum of its pair scores (NVLink and shared switches rank high)."""
    return sum(a.pair_score(b) for a, b in combinations(gpus, 2))


def pick_gpus(hosts: Sequence[GPU], count: int, order: Sequence[GPU]) -> tuple[GPU, ...]:
    """Choose ``count`` of ``hosts``: the first in ``order`` for one GPU; for several, the best-connected
    set, with ``order`` (the policy's preference) breaking ties."""
    if count == 1 or len(hosts) == count:
        return tuple(order[:count])
    rank = {g.index: i for i, g in enumerate(order)}
    pool = list(order)
    total = 1
    for i in range(count):
        total = total * (len(pool) - i) // (i + 1)
    if total > MAX_TOPOLOGY_COMBINATIONS:
        pool = pool[: count + 4]
    best = max(combinations(pool, count),
               key=lambda s: (topology_score(s), -sum(rank[g.index] for g in s)))
    return tuple(sorted(best, key=lambda g: rank[g.index]))
