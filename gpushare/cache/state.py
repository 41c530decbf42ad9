"""The extender's view of the cluster: every node's GPUs and what holds them, fed by ``gpushare.kube.watch``.

State is rebuilt from the API alone (node inventories and pod annotations), so a restarted extender sees
exactly what its predecessor recorded. Bind adds a *reservation* the moment it picks GPUs, before it writes
anything, so concurrent filters and binds see the memory as taken; the watch later confirms it, or the
binder releases it when the bind fails.

Locking: each node has its own lock guarding its ``Node``; a small registry lock guards which node holds
which pod, and an index lock the tables of states (which shapes fit each node state, and the policies' answers
for it). Locks are taken in that order (node, registry, index), never the other way round, and two node locks
always in name order. Filter reads each node's state number and the tables without taking a node lock; only a
state a table has no answer for yet is judged under its node's lock.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import threading
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from itertools import compress, filterfalse, islice
from typing import Any, TypeVar

from gpushare.cache.fitindex import (
    FilterOutcome,
    NodeSummary,
    fit_check,
    judge_window,
    read_window,
    shape_key,
    sort_window,
    summarise,
)
from gpushare.contract import (
    ANN_AFFINITY,
    MemoryUnit,
    NodeInfo,
    PodInfo,
    PodRequest,
    RequestError,
    parse_request,
    read_assignment,
)
from gpushare.model import Node, Placement, build_node, gpu_capacity, gpu_signature, placement_of, state_signature
from gpushare.policies import highest_priority, node_priority
from gpushare.preemption import Held, VictimSet, ViolationCount, find_victims, hold

log = logging.getLogger(__name__)

# Distinct keys (policy, request shape, learned-workload version) with a table of answers per node state, and distinct
# request shapes (with a memory unit) with a table of the node states they fit (or why not); of each, the least
# recently used go first, an eighth of the bound at a time. Pods vary in CPU and memory too: the openb trace has 126
# shapes, gpuspec20 366 (275 once memory is dropped for scoring), and every price a repricing policy moves to starts
# new keys. With 128 tables, gpuspec20's filters started a fit table afresh (every state in the window judged again)
# for one pod in ten; with 1,024, one in thirty. ``MAX_MEMO_ENTRIES`` bounds their memory.
MAX_ANSWER_TABLES = 1024
# Answers one key's table holds, one per distinct node state asked about (1 MB or so when full). A full table drops
# the answers for states no node is in any more (a node that returns to one is asked again), and is cleared whole
# when live states still fill more than half of it.
MAX_STATE_ANSWERS = 16_384
# Answers all the tables of one kind (fit, answers, reasons) hold together, about 50 bytes each (a reason's sentence
# is shared: few distinct ones recur): when pods vary in CPU and memory nearly every node is in a state of its own,
# and 128 full tables of each kind would take 190 MiB. Past this the least recently used tables go first (down to
# seven eighths), checked every ``MEMO_CHECK_EVERY`` answers remembered.
MAX_MEMO_ENTRIES = 400_000
MEMO_CHECK_EVERY = 4_096
# Distinct node states numbered (state_signature -> id); forgotten whole when full. Ids are never reused, so a
# state numbered again only costs its answers once more.
MAX_STATE_IDS = 50_000
# Distinct GPU signatures numbered, for the node states' signatures to name each GPU by its number; forgotten with
# the states' (a number names a GPU only among the signatures of its time).
MAX_GPU_NUMBERS = 50_000
# The log of changed node names kept for ``changes``; a reader that falls further behind rereads every node.
MAX_CHANGES = 100_000
# Distinct failure reasons kept as one object each, for the reason tables to share (forgotten whole when full: only
# the sharing is lost). A reason depends on the pod's share and count and the node's GPUs, so a few hundred recur.
MAX_SHARED_REASONS = 16_384
# ``Bracket``: how many answer tables of the nearest requests on each side are looked into for a node state's
# score; how many tables of one key without CPU the index keeps when pruned (twice as many make it prune); and how
# many requests the index takes in before the entries of every table evicted since go, with the keys left without
# any: it never holds more entries than that beyond one per table kept.
BRACKET_PROBES = 8
BRACKET_TABLES = 256
BRACKET_SWEEP_EVERY = 4 * MAX_ANSWER_TABLES

T = TypeVar("T")
_UNKNOWN = object()


@dataclass(frozen=True, slots=True)
class Carry:
    """How the answers of one key may carry over from the key of an earlier ``version`` of the same ``family``
    (for a score: the policy and the request's shape, the version being what the policy has learned and priced)."""

    family: Hashable
    version: int
    unchanged_since: Callable[[int, Node], bool]
    """Whether an answer for the node's state at the given earlier version still holds."""


@dataclass(frozen=True, slots=True)
class Bracket:
    """Where a score may come from the scores of requests that differ from the pod's only in CPU, and in share within
    its class for a policy that weighs a share by its class (``ClassedShares``): a policy never scores a node higher
    for more CPU asked (``Policy.evaluate``), nor such a policy for a larger share of the same class, so a node state
    that got the same score for a request no larger than the pod's in either and for one no smaller in either gets
    it for the pod's too, and is not scored afresh for it."""

    key: Hashable
    """The answers' key with the pod's CPU request left out, and its share where it is ordered (the policy, the rest
    of the shape, the version)."""
    cpu: int
    """The pod's CPU request, millicores."""
    share: int
    """The pod's share per GPU where requests under ``key`` differ in it (one class), else 0."""

    @property
    def point(self) -> tuple[int, int]:
        """Where the request sits among those under ``key``: by CPU, then by share (a request no larger in either
        comes before it, one no smaller in either after)."""
        return (self.cpu, self.share)


def _bound(tables: Sequence[dict[int, Any]], state: int, tightest: Callable[[list[Any]], Any] | None) -> Any:
    """A bound on ``state``'s score from the scores ``tables`` hold for it (nearest request first): the first, where
    the nearest request is the tightest bound (``tightest`` None: all of the pod's share), else the ``tightest`` of
    them (``min`` for a ceiling, ``max`` for a floor); ``_UNKNOWN`` if none."""
    if tightest is None:
        for table in tables:
            score = table.get(state)
            if score is not None:
                return score
        return _UNKNOWN
    found = [score for table in tables if (score := table.get(state)) is not None]
    return tightest(found) if found else _UNKNOWN


Side = tuple[list[dict[int, Any]], Callable[[list[Any]], Any] | None]
"""The answer tables of one side of a request (``ClusterCache._bracketing``), nearest first, and how ``_bound`` takes
the side's bound from them."""


def _live(tables: Mapping[Hashable, dict[int, Any]], keys: Sequence[Hashable], points: Sequence[tuple[int, int]],
          share: int, order: range, below: bool) -> Side:
    """The answer tables still kept of ``keys``, in ``order``, at most ``BRACKET_PROBES`` of them, of the requests no
    larger in share than ``share`` (``below``) or no smaller (the others, before or after in ``order``, bound nothing):
    the index keeps the keys of tables evicted until it is pruned, and those are passed over. Where all are of
    ``share``, the nearest is the tightest bound; a request of another share may bound less tightly than a farther
    one (a smaller CPU and a larger share), and the side's bound is then the tightest of all (``min`` below, ``max``
    above)."""
    found: list[dict[int, Any]] = []
    mixed = False
    for n in order:
        other = points[n][1]
        if other > share if below else other < share:
            continue
        table = tables.get(keys[n])
        if table is not None:
            found.append(table)
            mixed = mixed or other != share
            if len(found) == BRACKET_PROBES:
                break
    return found, ((min if below else max) if mixed else None)


def _kept(points: Sequence[tuple[int, int]], keys: Sequence[Hashable], tables: Mapping[Hashable, dict[int, Any]]
          ) -> list[tuple[tuple[int, int], Hashable]]:
    """The bracket index's entries (``Bracket.point``, key) whose answer tables are still kept, ascending."""
    return [(p, k) for p, k in zip(points, keys, strict=True) if k in tables]


def _unzipped(entries: Sequence[tuple[tuple[int, int], Hashable]]
              ) -> tuple[tuple[tuple[int, int], ...], tuple[Hashable, ...]]:
    """The bracket index's ``entries`` as it stores them: the requests' points, and the keys in the same order."""
    return tuple(p for p, _ in entries), tuple(k for _, k in entries)


class ReservationError(Exception):
    """A bind could not reserve GPUs; the text tells the user why."""


@dataclass(eq=False, slots=True)
class Reservation:
    """GPUs held for a pod between a decision (bind's, a gang's plan or filter's choice) and the watch showing the pod
    bound."""

    node: str
    pod_key: str
    uid: str
    placement: Placement
    gpu_totals: tuple[int, ...]
    unit: MemoryUnit
    gang: str = ""
    """The gang (namespace/name) whose plan holds these GPUs for the pod until it binds; empty for a bind's own."""
    held_until: float = 0.0
    """For GPUs that filter chose and holds for the pod until its bind takes them over (``take_filter_hold``): the
    ``time.monotonic()`` at which the hold lapses if no bind came; 0 for a bind's own and a gang's."""
    request: PodRequest | None = None
    """What the hold of filter's was chosen for: a bind takes it over only for the same request."""


def _overcommitted(node: Node, placement: Placement) -> bool:
    """Whether a GPU of ``placement`` now holds more than it has, or an exclusive pod beside others: what a pod that
    the watch accounts beside a hold can make of it (the API's word counts, even where it overcommits)."""
    for index in placement.gpu_indices:
        gpu = node.gpu(index)
        if gpu is None or gpu.used > gpu.total or (gpu.exclusive and gpu.holders > 1):
            return True
    return False


class _Entry:
    """One node: its API view (``None`` once deleted or before it was seen) and its accounted state."""

    __slots__ = ("affinity", "info", "lock", "name", "state", "state_id")

    def __init__(self, name: str) -> None:
        self.affinity: frozenset[str] = frozenset()
        """The affinity values some pod on the node's GPUs carries (what ``ClusterCache._affinity`` indexes)."""
        self.name = name
        self.lock = threading.Lock()
        self.info: NodeInfo | None = None
        self.state = Node(name=name, gpus=[])
        self.state_id = -1


class ClusterCache:
    """Per-node GPU state for every node, fed by ``ClusterWatch`` and changed by bind's reservations."""

    def __init__(self, unit: MemoryUnit = MemoryUnit.GiB, tie_seed: int = 0) -> None:
        self.unit = unit
        """The unit of nodes whose device plugin does not publish one; every other node is read in its own."""
        self.tie_seed = tie_seed
        """The seed of ``node_priority``, by which ``favourite`` breaks ties."""
        self._priority = functools.partial(node_priority, seed=tie_seed)
        self._entries: dict[str, _Entry] = {}
        self._summaries: dict[str, NodeSummary] = {}
        self._registry = threading.Lock()
        self._pod_nodes: dict[str, str] = {}
        self._reservations: dict[str, Reservation] = {}
        self._index_lock = threading.Lock()
        # Request shape -> node state id -> whether the shape fits a node in that state.
        self._fit_tables: dict[Hashable, dict[int, bool]] = {}
        # (request shape, memory unit) -> node state id -> why the shape does not fit there (unresolvable, reason).
        self._reason_tables: dict[Hashable, dict[int, tuple[bool, str]]] = {}
        self._reasons: dict[tuple[bool, str], tuple[bool, str]] = {}  # see ``_shared_reason``
        # Equal states share one id (``state_signature``), and a node gets a new one whenever it changes.
        self._state_ids: dict[Hashable, int] = {}
        self._next_state_id = 0
        self._gpu_numbers: dict[Hashable, int] = {}
        self._node_states: dict[str, int] = {}
        # Node state id -> the summary of that state (equal states, equal summaries), for the states some node is in:
        # filter judges a state the shape has not met from it, in a compiled pass, without the node's lock.
        self._state_summaries: dict[int, NodeSummary] = {}
        # Node state id -> the names of the nodes in that state, by ``node_priority``, lowest first.
        self._ranked: dict[int, list[str]] = {}
        # key -> node state id -> answer.
        self._answer_tables: dict[Hashable, dict[int, Any]] = {}
        # Bracket.key -> the requests (``Bracket.point``) with an answer table under it, ascending, and those tables'
        # keys: replaced whole under the index lock, so that a reader without it sees one consistent pair.
        self._bracket_index: dict[Hashable, tuple[tuple[tuple[int, int], ...], tuple[Hashable, ...]]] = {}
        self._bracket_added = 0  # requests the index took in since its last sweep (``BRACKET_SWEEP_EVERY``)
        # Answers that may carry over between versions (``Carry``): per family, the version and key asked for last;
        # per key, the version and key of its family asked for before it.
        self._newest: dict[Hashable, tuple[int, Hashable]] = {}
        self._prior: dict[Hashable, tuple[int, Hashable]] = {}
        # When each fit table's shape and each answer table's key was last asked for: the least recently used goes
        # first when there are too many, so a workload of more shapes than the bound keeps its frequent ones.
        self._used: dict[Hashable, int] = {}
        self._uses = itertools.count()
        # Answers remembered so far, in tables of either kind: every ``MEMO_CHECK_EVERY`` the kind's total is checked.
        # Read and added to without a lock: a count lost to a race only delays a check.
        self._remembered = 0
        self._capacity: dict[str, int] | None = None
        # Pods a preemption nominated to a node and not bound yet, by node: rare, so read outside the fit index.
        self._nominated: dict[str, dict[str, tuple[str, PodRequest]]] = {}
        # Affinity value -> the nodes where some GPU holds a pod with it (reservations included), under the index
        # lock: the cluster-wide view that sends the rest of an affinity group to its GPUs.
        self._affinity: dict[str, set[str]] = {}
        # The names of changed nodes in order, under the index lock, for readers that follow the cluster's free
        # capacity (``changes``); ``_changes_start`` is the position of its first entry.
        self._changes: list[str] = []
        self._changes_start = 0

    # -- reading -------------------------------------------------------------------------------------------

    def node_names(self) -> list[str]:
        return sorted(self._summaries)

    def unknown(self, names: Iterable[str]) -> list[str]:
        """The names of ``names`` that are no node in the cache (one C-level pass)."""
        return list(filterfalse(self._summaries.__contains__, names))

    def gpu_capacity(self) -> dict[str, int]:
        """GPU memory per model over every known node's healthy GPUs; recomputed only after a node changed
        (prioritize asks for it per pod, placements do not change it)."""
        capacity = self._capacity
        if capacity is None:
            states = [e.state for e in list(self._entries.values()) if e.info is not None]
            capacity = self._capacity = gpu_capacity(states)
        return capacity

    def changes(self, position: int) -> tuple[int, list[str] | None]:
        """The names of the nodes whose state id changed (they came, left, or changed what decisions read) since
        ``position``, a number this returned before (0 at first), and the position to ask from next time; ``None``
        instead of names when the log no longer reaches back that far (the reader should then read every node)."""
        with self._index_lock:
            end = self._changes_start + len(self._changes)
            if position < self._changes_start:
                return end, None
            return end, list(dict.fromkeys(self._changes[position - self._changes_start:]))

    @contextmanager
    def locked(self, name: str) -> Iterator[Node | None]:
        """The node's state under its lock, or ``None`` for a node the cache does not know."""
        entry = self._entries.get(name)
        if entry is None:
            yield None
            return
        with entry.lock:
            yield entry.state if entry.info is not None else None

    def resolve(self, request: PodRequest) -> PodRequest:
        """The request with ``affinity_held`` saying whether some GPU in the cluster holds its affinity group.

        Filter, prioritize, preempt and bind each resolve the pod's parsed request before judging it.
        """
        value = request.sharing.affinity
        if not value:
            return request
        with self._index_lock:
            held = bool(self._affinity.get(value))
        return request if held == request.affinity_held else replace(request, affinity_held=held)

    def filter(self, names: list[str], request: PodRequest, pod_uid: str = "", explain: bool = True) -> FilterOutcome:
        """Split ``names`` into nodes where the pod fits now, fails now, and could never fit.

        Pods nominated to a node by a preemption, with at least this pod's priority, hold their room there.
        Without ``explain``, the nodes that fail are worded only when none passes, and otherwise listed in
        ``left_out``: kube-scheduler reads an extender's reasons only for a pod that no node passed. (A pod with
        sharing values is judged node by node on the full state, and its failures are always worded.)

        ``TypeError`` if a name is not hashable (a malformed request).
        """
        if request.sharing.constrained:
            return self._filter_sharing(names, request, pod_uid)
        passed, failing, states, counts, firsts = self._split(names, request)
        if not failing or (passed and not explain):
            out = self._respect_nominated(FilterOutcome(passed, passed_states=states, passed_counts=counts,
                                                        passed_firsts=firsts), request, pod_uid)
            if not failing or out.passed:
                out.left_out = failing
                return out
            # Nominated pods hold every node that passed: the pod fails everywhere, so its reasons are read.
        # Work only for the nodes that fail, their reasons remembered per node state (``_explain``).
        out = FilterOutcome(list(passed))
        self._explain(failing, request, out)
        return self._respect_nominated(out, request, pod_uid)

    def _split(self, names: list[str], request: PodRequest
               ) -> tuple[list[str], list[str], list[int | None], dict[int | None, int], dict[int | None, str]]:
        """The names where the request's shape fits, those where it does not, the state ids of the first, how many
        of them each of those states holds and the first of them in each.

        Compiled passes (``read_window``, ``judge_window``, ``sort_window``): one lookup per name for its node's state
        and one in the shape's table of states; the states the shape has not met (usually the few nodes changed since
        the last pod of this shape) each judged once, on the summary kept for the state; Python work only for a name
        whose state ended as the window was read, judged under its node's lock.
        """
        table = self._fit_table(request)
        # Lock-free: at worst the state of a node from just before a change.
        states, fits, unjudged = read_window(names, self._node_states, table)
        if unjudged:
            check = fit_check(request)
            left, added = judge_window(states, fits, table, self._state_summaries, check)
            if added:
                self._bound(table, added)
            for i in left:
                fits[i] = self._judge(names[i], table, check)
        return sort_window(names, states, fits)

    def _judge(self, name: str, table: dict[int, bool], check: Callable[[NodeSummary], bool]) -> bool:
        """Whether the node's current state admits the shape of ``check``, remembered in ``table``; ``False`` for
        a node the cache does not know (filter words it). For the names ``judge_window`` leaves: a node read
        without a state, or in a state that ended as the window was read."""
        entry = self._entries.get(name)
        if entry is None:
            return False
        with entry.lock:  # its summary and state id change together, under this lock
            summary = self._summaries.get(name)
            if entry.info is None or summary is None:
                return False
            fits = check(summary)
            self._remember(table, entry.state_id, fits)
        return fits

    def _filter_sharing(self, names: list[str], request: PodRequest, pod_uid: str) -> FilterOutcome:
        """Filter for a pod with sharing values: every node is judged on its full state, since the summaries the
        fit sets read leave out who holds each GPU. Once its affinity group holds GPUs, only their nodes pass."""
        out = FilterOutcome()
        judged = names
        if request.affinity_held:
            value = request.sharing.affinity
            with self._index_lock:
                group = set(self._affinity.get(value, ()))
            shown = sorted(group)
            where = ", ".join(shown[:5]) + (f" and {len(shown) - 5} more" if len(shown) > 5 else "")
            judged = []
            for name in names:
                if name in group or name not in self._summaries:  # an unknown node is worded by _explain
                    judged.append(name)
                else:
                    out.failed[name] = (f"pods of {ANN_AFFINITY}={value} already hold GPUs on node(s) {where}, and "
                                        "the pod may only join them")
        self._explain(judged, request, out)
        return self._respect_nominated(out, request, pod_uid)

    def _respect_nominated(self, out: FilterOutcome, request: PodRequest, pod_uid: str) -> FilterOutcome:
        """Fail passed nodes where pods nominated there with at least this pod's priority leave it no room.

        A preemption freed that room for its preemptor; handing it to this pod would leave the preemptor
        pending with its victims already gone. ``out`` is never changed, only copied: its lists may be memoised.
        """
        if not self._nominated:
            return out
        held = {name: found for name in out.passed if (found := self.held_on(name, request, pod_uid))}
        if not held:
            return out
        adjusted = FilterOutcome(list(out.passed), dict(out.failed), dict(out.unresolvable))
        for name, nominated in held.items():
            with self.locked(name) as node:
                if node is None or hold(node, nominated).fits(request):
                    continue
            adjusted.passed.remove(name)
            adjusted.failed[name] = ("node(s) have room only for pods nominated there by a preemption "
                                     f"({', '.join(h.key for h in nominated)}), which come first")
        return adjusted

    def held_on(self, name: str, request: PodRequest, pod_uid: str) -> list[Held]:
        """The pods nominated to ``name`` with at least ``request``'s priority, other than the pod itself."""
        with self._registry:
            nominated = list(self._nominated.get(name, {}).items())
        return [Held(key, wanted) for key, (uid, wanted) in nominated
                if uid != pod_uid and wanted.priority >= request.priority]

    def preempt(self, request: PodRequest, pod_uid: str, kube_victims: Mapping[str, tuple[Collection[str], int]],
                violations: ViolationCount | None = None) -> dict[str, VictimSet]:
        """The victims the pod needs on each candidate node; nodes with no such set (or unknown) are left out.

        ``kube_victims`` maps each candidate node to kube-scheduler's proposed victim UIDs and its
        PodDisruptionBudget count for them; ``violations`` counts a set's violations from the budgets, where known.
        """
        out: dict[str, VictimSet] = {}
        for name, (proposed, kube_violations) in kube_victims.items():
            held = self.held_on(name, request, pod_uid)
            with self.locked(name) as node:
                found = None if node is None else find_victims(node, request, proposed, kube_violations, held,
                                                               violations)
            if found is not None:
                out[name] = found
        return out

    def _fit_table(self, request: PodRequest) -> dict[int, bool]:
        """The node states the request's shape fits (``True``) or not, as judged so far."""
        return self._table(self._fit_tables, shape_key(request))

    def _explain(self, names: list[str], request: PodRequest, out: FilterOutcome) -> None:
        """Judge nodes on their full state and word the failures, remembered per node state.

        A reason names no node ("node(s) have ..."), so nodes in one state share it, as they share fit answers:
        a pod no node of its window passes costs a wording per state, not per name. Kept per node, with two in five
        GPU pods bound to models, they made the node entries 148 MB instead of the default trace's 76 at 15,000
        nodes with 60,000 pods; per state, that run grew by 225 MB instead of 279. The unit is part of the key
        (reasons give memory in the node's unit, which its state does not fix), and a node whose GPUs could not be
        read is worded every time (its reason is its own).
        """
        shape = shape_key(request)
        tables: dict[MemoryUnit, dict[int, tuple[bool, str]]] = {}
        for name in names:
            entry = self._entries.get(name)
            if entry is None or name not in self._summaries:
                out.failed[name] = ("node(s) are not in the gpushare extender's cache (not watched yet, or deleted); "
                                    "kube-scheduler will try again")
                continue
            unit = entry.state.unit
            table = tables.get(unit)
            if table is None:
                table = tables[unit] = self._table(self._reason_tables, (shape, unit))
            known = table.get(entry.state_id)  # lock-free: at worst the reason from just before a change
            if known is None:
                with entry.lock:
                    node = entry.state
                    if node.fits(request):
                        out.passed.append(name)
                        continue
                    unresolvable = node.unresolvable_reason(request)
                    known = self._shared_reason((True, unresolvable) if unresolvable else (
                        False, node.failure_reason(request)))
                    if node.defect is None and node.unit is unit:
                        self._remember(table, entry.state_id, known)
            (out.unresolvable if known[0] else out.failed)[name] = known[1]

    def _shared_reason(self, reason: tuple[bool, str]) -> tuple[bool, str]:
        """``reason`` as the one object kept for it: the same few sentences recur across states and shapes, and at
        15,000 nodes with 60,000 pods of varied CPU the reason tables held 34 MiB, most of it a tuple and a string
        per entry."""
        shared = self._reasons
        if len(shared) >= MAX_SHARED_REASONS:
            shared.clear()
        return shared.setdefault(reason, reason)

    def evaluate(self, names: Iterable[str], read: Callable[[Node], T]) -> dict[str, T | None]:
        """``read`` of each known node under its lock; ``None`` for unknown nodes."""
        out: dict[str, T | None] = {}
        for name in names:
            with self.locked(name) as node:
                out[name] = None if node is None else read(node)
        return out

    def evaluate_memoised(self, names: Sequence[str], key: Hashable, read: Callable[[Node], T],
                          max_reads: int | None = None, states: list[int | None] | None = None,
                          carry: Carry | None = None, bracket: Bracket | None = None) -> list[T | None] | None:
        """``read`` of each of ``names`` (``None`` for unknown nodes), in their order: ``evaluate_states`` spelt out
        per name (prioritize answers for every name)."""
        evaluated = self.evaluate_states(names, key, read, max_reads, states, carry, bracket=bracket)
        if evaluated is None:
            return None
        states, answers = evaluated
        return list(map(answers.__getitem__, states))

    def evaluate_states(self, names: Sequence[str], key: Hashable, read: Callable[[Node], T],
                        max_reads: int | None = None, states: list[int | None] | None = None,
                        carry: Carry | None = None, firsts: Mapping[int | None, str] | None = None,
                        bracket: Bracket | None = None, best_only: bool = False
                        ) -> tuple[list[int | None], dict[int | None, T | None]] | None:
        """The state id of each of ``names`` (``None`` for unknown nodes) and ``read``'s answer for each of those
        states, remembered under ``key`` for the state (``state_signature``): every node in that state shares it,
        and a node that changes gets its answer for its new state.

        ``read`` must depend on nothing but the node's state and what ``key`` names (for a score: the policy,
        the request's shape and the version of what the policy learned). kube-scheduler sends the same nodes
        for pod after pod and few of them change in between, and large clusters hold many nodes in identical
        states (empty ones, full ones): a window of hundreds of names holds a handful of states, so the answers
        are looked up per state, not per name (the one pass per name is the C-level one that finds the states).
        With ``max_reads``, ``None`` instead when more states than that have no answer yet (nothing is read):
        the caller can answer on its event loop when the work is lookups, and elsewhere when it is not.
        ``states``: the nodes' state ids as a filter just read them (``FilterOutcome.passed_states``), so that
        the names are not looked up again, and ``firsts``: those states, each once, in the order they first appear,
        with the first of the names in each (``FilterOutcome.passed_firsts``), so that the names are not paired with
        their states again. With ``carry``, a state without an answer under ``key`` takes the one it had under the
        family's key asked for before, where ``carry.unchanged_since`` says it still holds: not a read, so not
        counted against ``max_reads``. With ``bracket``, nor is a score that the state's scores for the nearest
        requests of other CPUs (and shares of the same class) settle (``Bracket``); with ``best_only`` too (answers
        that are scores, and only the states of the highest score wanted: filter's favourite), a state whose score
        cannot reach one known gets ``None``, unread.
        """
        table = self._answer_table(key)
        if states is None:
            # Lock-free: at worst the answer for the node's state from just before a change.
            states = list(map(self._node_states.get, names))
        # Each state once, in the order the names show them.
        answers: dict[int | None, Any] = dict.fromkeys(states if firsts is None else firsts)
        missing = []
        for state in answers:
            if state is not None:
                known = answers[state] = table.get(state, _UNKNOWN)
                if known is _UNKNOWN:
                    missing.append(state)
        if missing:
            # One node per state is read, under its lock: the first of the names in that state.
            first = firsts if firsts is not None else dict(zip(reversed(states), reversed(names), strict=True))
            if carry is not None and (prior := self._prior_table(key, carry)) is not None:
                carried = self._carried(prior, carry.unchanged_since)
                # Only a state the prior version answered may carry its answer: the others (most of them, nodes
                # changed since) are not read for it.
                earlier = prior[1]
                still = []
                for state in missing:
                    if state in earlier:
                        known = answers[state] = self._answer(first[state], table, carried, _UNKNOWN)
                        if known is not _UNKNOWN:
                            continue
                    still.append(state)
                missing = still
            ceilings: dict[int, Any] = {}
            if bracket is not None and missing:
                (below, low), (above, high) = self._bracketing(bracket, key)
                if below or above:
                    still = []
                    for state in missing:
                        ceiling = _bound(below, state, low)
                        if ceiling is not _UNKNOWN and ceiling == _bound(above, state, high):
                            answers[state] = ceiling
                            self._remember(table, state, ceiling)
                            continue
                        still.append(state)
                        if best_only and ceiling is not _UNKNOWN:
                            ceilings[state] = ceiling
                    missing = still
            if max_reads is not None and len(missing) > max_reads:
                return None
            if ceilings:
                self._read_best(missing, ceilings, answers, first, table, read)
            else:
                for state in missing:
                    answers[state] = self._answer(first[state], table, read)
        return states, answers

    def _bracketing(self, bracket: Bracket, key: Hashable) -> tuple[Side, Side]:
        """The answer tables of the ``BRACKET_PROBES`` requests nearest below ``bracket`` (no larger in CPU nor share)
        and above it (no smaller in either) under ``bracket.key``, nearest first; the table of ``key`` (this
        request's) joins the index if new."""
        point = bracket.point
        points, keys = self._bracket_index.get(bracket.key, ((), ()))
        i = bisect_left(points, point)
        if i == len(points) or points[i] != point:
            with self._index_lock:
                points, keys = self._bracket_index.get(bracket.key, ((), ()))
                i = bisect_left(points, point)
                if i == len(points) or points[i] != point:
                    points, keys = (*points[:i], point, *points[i:]), (*keys[:i], key, *keys[i:])
                    if len(points) > 2 * BRACKET_TABLES:
                        # Pruned in bulk, not per request: with every pod its own CPU each filter adds a request, and
                        # walking the whole index each time cost more than the scores it saved. The tables evicted
                        # since go, then the smallest requests' (never this one's) down to the bound.
                        kept = _kept(points, keys, self._answer_tables)
                        excess = len(kept) - BRACKET_TABLES
                        if excess > 0:
                            kept = [entry for n, entry in enumerate(kept) if n >= excess or entry[1] == key]
                            if len(kept) > BRACKET_TABLES:  # this one was among the smallest: it leads
                                del kept[1]
                        points, keys = _unzipped(kept)
                        i = bisect_left(points, point)
                    self._bracket_index[bracket.key] = (points, keys)
                    self._bracket_added += 1
                    if self._bracket_added > BRACKET_SWEEP_EVERY:
                        # Earlier versions and shapes no longer asked leave entries whose tables are gone, under
                        # keys no request asks again: swept together, so that they never add up.
                        self._sweep_bracket_index()
                        points, keys = self._bracket_index.get(bracket.key, ((), ()))
                        i = bisect_left(points, point)
        tables, share = self._answer_tables, bracket.share
        return (_live(tables, keys, points, share, range(i - 1, -1, -1), below=True),
                _live(tables, keys, points, share, range(i + 1, len(keys)), below=False))

    def _sweep_bracket_index(self) -> None:
        """The bracket's index without the entries of tables evicted, nor the keys left without any (under the index
        lock)."""
        tables = self._answer_tables
        swept = {}
        for name, (points, keys) in self._bracket_index.items():
            kept = _kept(points, keys, tables)
            if kept:
                swept[name] = _unzipped(kept)
        self._bracket_index = swept
        self._bracket_added = 0

    def _read_best(self, missing: list[int], ceilings: dict[int, Any], answers: dict[int | None, Any],
                   first: Mapping[int | None, str], table: dict[int, Any], read: Callable[[Node], Any]) -> None:
        """``read`` the ``missing`` states that may score the highest of ``answers``, into ``answers``; a state whose
        ceiling (its score for a request no larger, ``Bracket``) is below a score known gets ``None`` unread."""
        highest = max((a for a in answers.values() if a is not None and a is not _UNKNOWN), default=None)
        # States without a ceiling first, then the highest ceilings: each read may raise the highest known.
        missing.sort(key=lambda state: (state in ceilings, -ceilings.get(state, 0.0)))
        for state in missing:
            ceiling = ceilings.get(state)
            if ceiling is not None and highest is not None and ceiling < highest:
                answers[state] = None
                continue
            answer = answers[state] = self._answer(first[state], table, read)
            if answer is not None and (highest is None or answer > highest):
                highest = answer

    def _prior_table(self, key: Hashable, carry: Carry) -> tuple[int, dict[int, Any]] | None:
        """The version and answer table of ``carry.family``'s key asked for before ``key``, if it is still kept."""
        newest = self._newest.get(carry.family)
        if newest is None or newest[0] < carry.version:
            with self._index_lock:
                newest = self._newest.get(carry.family)
                if newest is None or newest[0] < carry.version:
                    if newest is not None:
                        self._prior[key] = newest
                    self._newest[carry.family] = (carry.version, key)
                    if len(self._prior) > 2 * MAX_ANSWER_TABLES or len(self._newest) > 2 * MAX_ANSWER_TABLES:
                        # Links to tables gone (least recently used) lead nowhere: dropped together.
                        kept = self._answer_tables
                        self._prior = {k: link for k, link in self._prior.items() if k in kept and link[1] in kept}
                        self._newest = {f: link for f, link in self._newest.items() if link[1] in kept}
        link = self._prior.get(key)
        if link is None:
            return None
        version, prior_key = link
        table = self._answer_tables.get(prior_key)
        return None if table is None else (version, table)

    def favourite(self, names: Sequence[str], states: list[int | None], best: Collection[int | None],
                  counts: Mapping[int | None, int] | None = None) -> str:
        """Of ``names``, in the ``states`` a filter read for them, the node in one of the ``best`` states that
        ``node_priority`` ranks highest (with the cache's seed): the policy's favourite, once the scores have chosen
        the states (``best_states``). Some name must be in a best state.

        Filter asks this for every GPU pod, and ranking the names themselves costs a lookup of each: half of
        openb gpushare60's pods find 200 or more names in the best states. Each state keeps its nodes by priority
        instead, and a walk down from the top meets one of the k names among the state's n nodes after about
        n/k of them. A state is walked where that is well under k, and given up after k (a node may have changed
        state since the filter read it); the names in the other best states are ranked themselves.
        """
        found: list[str] = []
        among: set[str] | None = None
        unwalked: set[int | None] = set()
        # How many names each best state has: ``counts`` where the filter's split counted them (each state's names),
        # else one C-level pass (``states.count`` per state walked the window once for each: a sixth of a filter
        # where many states tie).
        if counts is None:
            counts = Counter(compress(states, map(best.__contains__, states)))
        with self._index_lock:
            for state in best:
                count = counts[state]
                ranked = self._ranked.get(state, []) if state is not None else []
                if len(ranked) > count * count // 4:
                    unwalked.add(state)
                    continue
                among = set(names) if among is None else among
                top = next(filter(among.__contains__, islice(reversed(ranked), count)), None)
                if top is None:
                    unwalked.add(state)
                else:
                    found.append(top)
        if unwalked:
            found.extend(compress(names, map(unwalked.__contains__, states)))
        return highest_priority(found, self.tie_seed)

    def _answer(self, name: str, table: dict[int, Any], read: Callable[[Node], Any], missing: Any = None) -> Any:
        """One node's answer for its current state: from ``table``, else ``read`` and remembered there (unless
        ``read`` has none: ``_UNKNOWN``); ``missing`` for a node the cache does not hold."""
        entry = self._entries.get(name)
        if entry is None:
            return missing
        with entry.lock:
            if entry.info is None:
                return missing
            known = table.get(entry.state_id, _UNKNOWN)
            if known is _UNKNOWN:
                known = read(entry.state)
                if known is not _UNKNOWN:
                    self._remember(table, entry.state_id, known)
        return known

    def _carried(self, prior: tuple[int, dict[int, Any]], unchanged_since: Callable[[int, Node], bool]
                 ) -> Callable[[Node], Any]:
        """A ``read`` for ``_answer``: the node's answer in the ``prior`` version's table where it still holds
        (called under the node's lock, so its state id is the one of ``node``), else ``_UNKNOWN``."""
        version, earlier = prior

        def read(node: Node) -> Any:
            known = earlier.get(self._node_states.get(node.name, -1), _UNKNOWN)
            return known if known is _UNKNOWN or unchanged_since(version, node) else _UNKNOWN
        return read

    def _remember(self, table: dict[int, Any], state: int, answer: Any) -> None:
        """``table[state] = answer``, within the bounds of ``_bound``."""
        table[state] = answer
        self._bound(table, 1)

    def _bound(self, table: dict[int, Any], added: int) -> None:
        """Keep ``table``, just given ``added`` answers, within ``MAX_STATE_ANSWERS`` and the tables of each kind
        together within ``MAX_MEMO_ENTRIES``."""
        if len(table) > MAX_STATE_ANSWERS:
            # Lock-free, like the readers: at worst a state that has just ended is kept until the next time.
            for dead in list(filterfalse(self._ranked.__contains__, table)):
                table.pop(dead, None)
            if len(table) > MAX_STATE_ANSWERS // 2:
                table.clear()
        before = self._remembered
        self._remembered = before + added
        if before // MEMO_CHECK_EVERY != self._remembered // MEMO_CHECK_EVERY:
            with self._index_lock:
                for tables in (self._fit_tables, self._answer_tables, self._reason_tables):
                    _evict_least_used(tables, self._used, MAX_MEMO_ENTRIES, len)

    def _answer_table(self, key: Hashable) -> dict[int, Any]:
        return self._table(self._answer_tables, key)

    def _table(self, tables: dict[Hashable, dict[int, Any]], key: Hashable) -> dict[int, Any]:
        """``tables[key]``, made empty if missing; the least recently used table goes past ``MAX_ANSWER_TABLES``."""
        table = tables.get(key)
        if table is None:
            with self._index_lock:
                table = tables.get(key)
                if table is None:
                    table = tables[key] = {}
                    self._used[key] = next(self._uses)  # the newest is not the one to go
                    _evict_least_used(tables, self._used, MAX_ANSWER_TABLES)
        self._used[key] = next(self._uses)
        return table

    # -- reservations --------------------------------------------------------------------------------------

    def reserve(self, node_name: str, pod_key: str, uid: str, request: PodRequest,
                choose: Callable[[Node], tuple[int, ...] | None], held_until: float = 0.0) -> Reservation:
        """Pick GPUs with ``choose`` under the node's lock and hold them for the pod at once; ``held_until``: a hold of
        filter's choice, lapsing then (``Reservation.held_until``)."""
        entry = self._entries.get(node_name)
        if entry is None:
            raise ReservationError(f"node {node_name} is not in the gpushare extender's cache")
        with entry.lock:
            node = entry.state
            if entry.info is None:
                raise ReservationError(f"node {node_name} is not in the gpushare extender's cache")
            with self._registry:
                self._check_unplaced(pod_key)
            gpus = choose(node)
            if gpus is None:
                reason = node.unresolvable_reason(request) or node.failure_reason(request)
                raise ReservationError(f"the pod no longer fits: {reason}")
            with self._registry:
                self._check_unplaced(pod_key)
                try:
                    placement = node.place(pod_key, request, gpus)
                except ValueError as exc:
                    raise ReservationError(str(exc)) from None
                totals = tuple(g.total for i in gpus if (g := node.gpu(i)) is not None)
                reservation = Reservation(node_name, pod_key, uid, placement, totals, node.unit,
                                          held_until=held_until, request=request if held_until else None)
                self._reservations[pod_key] = reservation
                self._pod_nodes[pod_key] = node_name
            self._refresh(entry)
        return reservation

    def _check_unplaced(self, pod_key: str) -> None:
        if pod_key in self._reservations:
            raise ReservationError(f"pod {pod_key} is already being bound to node {self._reservations[pod_key].node}")
        if pod_key in self._pod_nodes:
            raise ReservationError(f"pod {pod_key} already holds GPUs on node {self._pod_nodes[pod_key]}")

    def release(self, reservation: Reservation) -> None:
        """Give back a reservation whose bind failed (a no-op once confirmed or replaced)."""
        self._give_back(reservation, None)

    def _give_back(self, reservation: Reservation, held_by: float | None) -> bool:
        """``release``; with ``held_by``, only while it is still a hold of filter's lapsing by then (a bind may have
        taken it over meanwhile). Whether it was given back."""
        entry = self._entries.get(reservation.node)
        if entry is None:
            return False
        with entry.lock, self._registry:
            if self._reservations.get(reservation.pod_key) is not reservation:
                return False
            if held_by is not None and not 0.0 < reservation.held_until <= held_by:
                return False
            del self._reservations[reservation.pod_key]
            del self._pod_nodes[reservation.pod_key]
            entry.state.remove(reservation.pod_key)
            self._refresh(entry)
        return True

    def reservations(self) -> int:
        return len(self._reservations)

    # -- filter's choice, held until its bind ----------------------------------------------------------------

    def drop_filter_hold(self, pod_key: str) -> None:
        """Give back what an earlier filter held for the pod: kube-scheduler filters it again, so that choice is void
        (and must not crowd the pod out of its own favourite)."""
        reservation = self._reservations.get(pod_key)
        if reservation is not None and reservation.held_until:
            self._give_back(reservation, math.inf)

    def take_filter_hold(self, pod_key: str, uid: str, node_name: str, request: PodRequest) -> Reservation | None:
        """The GPUs filter held for this incarnation of the pod and ``request`` on ``node_name``, now bind's own
        reservation; ``None`` (any other hold of the pod given back) when filter held nothing such, or when a pod the
        watch has shown since (bound by a peer replica or another scheduler) took the room it held."""
        reservation = self._reservations.get(pod_key)
        if reservation is None or not reservation.held_until:
            return None
        entry = self._entries.get(node_name)
        if entry is not None and (reservation.uid, reservation.node, reservation.request) == (uid, node_name, request):
            with entry.lock, self._registry:
                if (self._reservations.get(pod_key) is reservation and reservation.held_until
                        and not _overcommitted(entry.state, reservation.placement)):
                    reservation.held_until = 0.0
                    return reservation
        self._give_back(reservation, math.inf)
        return None

    def release_lapsed_holds(self, now: float) -> int:
        """Give back filter's holds that no bind took over by ``now`` (``time.monotonic()``); how many."""
        with self._registry:
            lapsed = [r for r in self._reservations.values() if 0.0 < r.held_until <= now]
        return sum(self._give_back(reservation, now) for reservation in lapsed)

    # -- gangs: GPUs held for every planned member at once ----------------------------------------------------

    def snapshot(self, names: Iterable[str]) -> list[Node]:
        """Copies of the known nodes among ``names``, each read under its lock, for planning without locks."""
        out = []
        for name in names:
            with self.locked(name) as node:
                if node is not None:
                    out.append(node.copy())
        return out

    def hold_gang(self, gang: str, members: Mapping[str, tuple[str, PodRequest, str, tuple[int, ...]]]) -> None:
        """Hold GPUs for every member of ``gang`` at once (pod key -> UID, request, node, GPUs), or for none.

        Every node involved is locked (in name order) for the whole step, so no filter or bind sees part of the
        plan; ``ReservationError`` when any member no longer fits or is placed already, and nothing is held.
        """
        names = sorted({node for _, _, node, _ in members.values()})
        entries = [self._entries.get(name) for name in names]
        with ExitStack() as stack:
            for name, entry in zip(names, entries, strict=True):
                if entry is None:
                    raise ReservationError(f"node {name} is not in the gpushare extender's cache")
                stack.enter_context(entry.lock)
                if entry.info is None:
                    raise ReservationError(f"node {name} is not in the gpushare extender's cache")
            by_name = {e.name: e for e in entries if e is not None}
            done: list[Reservation] = []
            with self._registry:
                try:
                    for key, (uid, request, node_name, gpus) in members.items():
                        self._check_unplaced(key)
                        node = by_name[node_name].state
                        try:
                            placement = node.place(key, request, gpus)
                        except ValueError as exc:
                            raise ReservationError(str(exc)) from None
                        totals = tuple(g.total for i in gpus if (g := node.gpu(i)) is not None)
                        reservation = Reservation(node_name, key, uid, placement, totals, node.unit, gang)
                        self._reservations[key] = reservation
                        self._pod_nodes[key] = node_name
                        done.append(reservation)
                except ReservationError:
                    for reservation in done:
                        del self._reservations[reservation.pod_key]
                        del self._pod_nodes[reservation.pod_key]
                        by_name[reservation.node].state.remove(reservation.pod_key)
                    raise
            for entry in by_name.values():
                self._refresh(entry)

    def gang_hold(self, pod_key: str) -> Reservation | None:
        """The GPUs a gang's plan holds for the pod, while it is not bound yet."""
        reservation = self._reservations.get(pod_key)
        return reservation if reservation is not None and reservation.gang else None

    def gang_holds(self, gang: str) -> list[Reservation]:
        """Every hold of ``gang``'s plan whose pod is not bound yet."""
        with self._registry:
            return [r for r in self._reservations.values() if r.gang == gang]

    def held_gangs(self) -> set[str]:
        with self._registry:
            return {r.gang for r in self._reservations.values() if r.gang}

    # -- feeding from the API ------------------------------------------------------------------------------

    def replace_nodes(self, infos: Iterable[NodeInfo]) -> None:
        """A fresh node list: upsert all, forget nodes no longer listed (their pods stay accounted)."""
        seen = set()
        for info in infos:
            seen.add(info.name)
            self.upsert_node(info)
        for name in list(self._entries):
            if name not in seen:
                self.delete_node(name)

    def upsert_node(self, info: NodeInfo) -> None:
        entry = self._entry(info.name)
        with entry.lock:
            if entry.info == info:
                return  # a status heartbeat: nothing gpushare reads has changed
            state = build_node(info, self.unit)
            if state.defect is not None and state.defect != entry.state.defect:
                log.warning(state.defect, extra={"node": info.name})
            for key, placement in entry.state.placements.items():
                state.add(key, placement)
            entry.info = info
            entry.state = state
            self._capacity = None
            self._refresh(entry)

    def delete_node(self, name: str) -> None:
        entry = self._entries.get(name)
        if entry is None:
            return
        with entry.lock:
            old = entry.state
            entry.info = None
            entry.state = Node(name=name, gpus=[])
            self._capacity = None
            for key, placement in old.placements.items():
                entry.state.add(key, placement)
            self._refresh(entry)

    def replace_pods(self, pods: Iterable[PodInfo]) -> None:
        """A fresh pod list replaces every confirmed placement; reservations in flight are kept."""
        targets: dict[str, tuple[str, Placement]] = {}
        with self._registry:
            self._nominated = {}
        for pod in pods:
            self._nominate(pod)
            if pod.is_active and pod.node_name:
                targets[pod.key] = (pod.node_name, placement_of(pod, read_assignment(pod)))
        for node_name, _ in targets.values():
            self._entry(node_name)
        while True:
            entries = sorted(self._entries.values(), key=lambda e: e.name)
            with ExitStack() as stack:
                for entry in entries:
                    stack.enter_context(entry.lock)
                with self._registry:
                    if len(self._entries) != len(entries):
                        continue
                    chosen = dict(targets)
                    for key, reservation in list(self._reservations.items()):
                        listed = targets.get(key)
                        if listed is not None and (reservation.held_until or self._confirms(reservation, *listed)):
                            del self._reservations[key]
                        else:
                            chosen[key] = (reservation.node, reservation.placement)
                    by_node: dict[str, dict[str, Placement]] = {}
                    for key, (node_name, placement) in chosen.items():
                        by_node.setdefault(node_name, {})[key] = placement
                    for entry in entries:
                        state = build_node(entry.info, self.unit) if entry.info else Node(name=entry.name, gpus=[])
                        for key, placement in by_node.get(entry.name, {}).items():
                            state.add(key, placement)
                        entry.state = state
                        self._refresh(entry)
                    self._pod_nodes = {key: node_name for key, (node_name, _) in chosen.items()}
                    return

    def _nominate(self, pod: PodInfo) -> None:
        """Remember (or forget) the pod as nominated to a node: pending, active, with a GPU request."""
        wanted: PodRequest | None = None
        if pod.nominated_node and not pod.node_name and pod.is_active:
            try:
                wanted = parse_request(pod)
            except RequestError:
                wanted = None  # its filter tells the user; a pod that cannot be placed holds nothing
        with self._registry:
            for name in [n for n, pods in self._nominated.items() if pod.key in pods]:
                del self._nominated[name][pod.key]
                if not self._nominated[name]:
                    del self._nominated[name]
            if wanted is not None and wanted.gpu_count and pod.nominated_node:
                self._nominated.setdefault(pod.nominated_node, {})[pod.key] = (pod.uid, wanted)

    def nominated(self) -> int:
        with self._registry:
            return sum(len(pods) for pods in self._nominated.values())

    def upsert_pod(self, pod: PodInfo) -> None:
        self._nominate(pod)
        target = None
        if pod.is_active and pod.node_name:
            target = (pod.node_name, placement_of(pod, read_assignment(pod)))
        self._move(pod, target, gone=not pod.is_active)

    def delete_pod(self, pod: PodInfo) -> None:
        self._nominate(replace(pod, nominated_node=None))
        self._move(pod, None, gone=True)

    def _move(self, pod: PodInfo, target: tuple[str, Placement] | None, gone: bool) -> None:
        """Account the pod on ``target`` (or nowhere), respecting a reservation that is still in flight."""
        key = pod.key
        if target is not None:
            self._entry(target[0])
        while True:
            with self._registry:
                current = self._pod_nodes.get(key)
                reservation = self._reservations.get(key)
            if reservation is not None:
                # A gang's hold, or filter's, gives way to the pod bound anywhere: with several replicas the leader
                # binds it on GPUs of its own choosing, and what the API says the pod holds is what counts.
                confirmed = target is not None and (bool(reservation.gang or reservation.held_until)
                                                    or self._confirms(reservation, *target))
                ended = gone and pod.uid == reservation.uid
                if not confirmed and not ended:
                    return  # an event from before the bind, or a rival's; the bind settles it either way
            touched = sorted({n for n in (current, target[0] if target else None) if n is not None})
            entries = [self._entries[n] for n in touched]
            with ExitStack() as stack:
                for entry in entries:
                    stack.enter_context(entry.lock)
                with self._registry:
                    if self._pod_nodes.get(key) != current or self._reservations.get(key) is not reservation:
                        continue
                    if (reservation is None and target is not None and current == target[0]
                            and self._entries[current].state.placements.get(key) == target[1]):
                        # The pod as already accounted (a status update, a label): nothing decisions read changed,
                        # and the node's state and summary need not be rebuilt.
                        return
                    if (reservation is not None and target is not None and current == target[0]
                            and replace(target[1], uid=reservation.placement.uid) == reservation.placement):
                        # The watch confirms the reservation as it was made: the node's state is already what
                        # decisions read, and only the pod's UID is new to its placement.
                        self._entries[current].state.placements[key] = target[1]
                        del self._reservations[key]
                        return
                    if current is not None:
                        self._entries[current].state.remove(key)
                    if target is not None:
                        self._entries[target[0]].state.add(key, target[1])
                        self._pod_nodes[key] = target[0]
                    else:
                        self._pod_nodes.pop(key, None)
                    self._reservations.pop(key, None)
                for entry in entries:
                    self._refresh(entry)
                return

    @staticmethod
    def _confirms(reservation: Reservation, node_name: str, placement: Placement) -> bool:
        return node_name == reservation.node and placement.gpu_indices == reservation.placement.gpu_indices

    def _entry(self, name: str) -> _Entry:
        entry = self._entries.get(name)
        if entry is None:
            with self._registry:
                entry = self._entries.setdefault(name, _Entry(name))
        return entry

    def _refresh(self, entry: _Entry) -> None:
        """Republish the node's summary and state id; call with its lock held after any change."""
        gpus = list(map(gpu_signature, entry.state.gpus))
        name = entry.name
        summary = None if entry.info is None else summarise(entry.state)
        if summary is None:
            self._summaries.pop(name, None)
        else:
            self._summaries[name] = summary
        affinity = frozenset(v for g in entry.state.gpus for v in g.affinity)
        with self._index_lock:
            if affinity != entry.affinity:
                self._index_affinity(name, entry.affinity, affinity)
                entry.affinity = affinity
            before = self._node_states.get(name)
            if summary is None:
                self._node_states.pop(name, None)
            else:
                state_id = entry.state_id = self._state_id(entry.state, gpus)
                self._node_states[name] = state_id
                self._state_summaries[state_id] = summary
            # Logged only when what decisions read changed: the watch confirming a bind's reservation, or a
            # node's status heartbeat, leaves the state as it was, and readers would copy the node for nothing.
            after = self._node_states.get(name)
            if after != before:
                if before is not None:
                    self._unrank(before, name)
                if after is not None:
                    insort(self._ranked.setdefault(after, []), name, key=self._priority)
                self._changes.append(name)
                if len(self._changes) > MAX_CHANGES:
                    dropped = len(self._changes) // 2
                    del self._changes[:dropped]
                    self._changes_start += dropped

    def _state_id(self, node: Node, gpus: list[Hashable]) -> int:
        """The id of the node's state, given its GPUs' signatures; call with the index lock held.

        The signature remembered names each GPU by a number (equal GPUs, equal numbers): tens of thousands of
        states are remembered when pods' CPU and memory vary, at a quarter of a kilobyte each instead of 1.3 with
        every GPU's fields (8 GPUs), and the few thousand distinct GPUs once each.
        """
        numbers = self._gpu_numbers

        def numbered() -> Hashable:
            return state_signature(node, [numbers.setdefault(g, len(numbers)) for g in gpus])

        signature = numbered()
        state_id = self._state_ids.get(signature)
        if state_id is None:
            if len(self._state_ids) >= MAX_STATE_IDS or len(numbers) >= MAX_GPU_NUMBERS:
                self._state_ids.clear()
                numbers.clear()
                signature = numbered()
            state_id = self._state_ids[signature] = self._next_state_id
            self._next_state_id += 1
        return state_id

    def _unrank(self, state: int, name: str) -> None:
        """Take the node out of its former state's ranking; call with the index lock held."""
        ranked = self._ranked[state]
        del ranked[ranked.index(name, bisect_left(ranked, self._priority(name), key=self._priority))]
        if not ranked:
            del self._ranked[state]
            self._state_summaries.pop(state, None)

    def _index_affinity(self, name: str, old: frozenset[str], new: frozenset[str]) -> None:
        """Move the node between the affinity groups' node sets; call with the index lock held."""
        for value in old - new:
            nodes = self._affinity.get(value)
            if nodes is not None:
                nodes.discard(name)
                if not nodes:
                    del self._affinity[value]
        for value in new - old:
            self._affinity.setdefault(value, set()).add(name)


def _evict_least_used(entries: dict[Any, Any], used: dict[Hashable, int], bound: int,
                      size: Callable[[Any], int] | None = None) -> None:
    """Past ``bound``, drop the least recently used entries until their ``size`` (each counts one unless given)
    adds up to at most seven eighths of it, keeping the most recently used one whatever its size (call with the
    index lock held). Dropping an eighth at once keeps the sort rare: a repricing policy makes new keys by the
    thousand, and sorting a thousand tables each time cost more than the answers they kept."""
    total = len(entries) if size is None else sum(map(size, entries.values()))
    if total <= bound:
        return
    target = bound - bound // 8
    for key in sorted(entries, key=used.__getitem__)[:-1]:
        dropped = entries.pop(key)
        total -= 1 if size is None else size(dropped)
        used.pop(key, None)
        if total <= target:
            return
