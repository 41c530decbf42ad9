"""Gangs: pods that must start together, decided in filter (docs/extender.md, "Gangs").

kube-scheduler asks about one pod at a time and cannot hold a bind open for long, so the gang is decided when a
member is filtered. With too few members in the watch, every node fails with a sentence. With enough, a pure
planner (``gpushare.policies.gang``) places every pending member at once on the nodes kube-scheduler offered
for this one, and the cache holds the plan's GPUs for all of them in one step; each member's filter then passes
only its planned node, prioritize ranks it first and bind takes exactly the planned GPUs. A gang that does not
fit at once holds nothing. A plan whose members are not all bound within the gang's timeout is released, with a
Warning Event on each member still waiting. Plans are atomic, so two gangs never hold parts of the same GPUs:
one gets them and the other waits for capacity.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from extender.placement import PolicyBook, RequestCache
from gpushare.cache.fitindex import FilterOutcome, shape_key
from gpushare.cache.gangs import GangIndex
from gpushare.cache.state import ClusterCache, ReservationError
from gpushare.contract import (
    ANN_GROUP_MIN_MEMBER,
    LABEL_POD_GROUP,
    GangRef,
    PodInfo,
    PodRequest,
    RequestError,
    read_gang,
)
from gpushare.kube.api import KubeError, NotFound, PodGroups
from gpushare.logs import clip
from gpushare.model import Node
from gpushare.policies import Policy
from gpushare.policies.base import Candidate
from gpushare.policies.gang import Member, plan_gang

log = logging.getLogger(__name__)

COMPONENT = "gpushare-extender"
# scheduler-plugins' coscheduling waits 60 s for a pod group by default (permitWaitingTimeSeconds); so do we.
DEFAULT_GANG_TIMEOUT_S = 60.0
# A PodGroup read is reused this long: filter runs per member and retry, the object rarely changes.
PODGROUP_TTL_S = 10.0
# A PodGroup read in filter must not hold up kube-scheduler's cycle for long.
PODGROUP_READ_TIMEOUT_S = 2.0
# PodGroups whose reads are remembered; past it the oldest go first (and are read again when next needed).
MAX_REMEMBERED_GROUPS = 10_000
# How often plans are checked against their deadline.
SWEEP_INTERVAL_S = 1.0

RecordEvent = Callable[[PodInfo, str, str], None]
"""Record a Warning Event on a pod: the pod, the reason and the message."""


@dataclass(frozen=True, slots=True)
class GangRule:
    """How many members must be placed at once, and how long a plan may wait for its binds."""

    min_member: int
    timeout_s: float


@dataclass(slots=True)
class _Plan:
    deadline: float
    timeout_s: float


class Gangs:
    def __init__(self, cache: ClusterCache, index: GangIndex, requests: RequestCache, book: PolicyBook,
                 pod_groups: PodGroups, record_event: RecordEvent, registry: CollectorRegistry,
                 timeout_s: float = DEFAULT_GANG_TIMEOUT_S) -> None:
        self._cache = cache
        self._index = index
        self._requests = requests
        self._book = book
        self._pod_groups = pod_groups
        self._record_event = record_event
        self.timeout_s = timeout_s
        self._rules: dict[str, tuple[float, GangRule]] = {}
        self._plans: dict[str, _Plan] = {}
        self._lock = threading.Lock()
        self.plans = Counter("gpushare_extender_gang_plans",
                             "Gang plans: held (GPUs held for every member at once), completed (no member waits any "
                             "more: bound, or deleted), released (timed out).", ["result"], registry=registry)
        self.rejections = Counter("gpushare_extender_gang_rejections",
                                  "Gang members failed on every node: waiting (too few members exist), unfit (the "
                                  "members do not fit at once).", ["reason"], registry=registry)
        registry.register(_GangCollector(self))

    # -- the gang's rule --------------------------------------------------------------------------------------

    def rule(self, ref: GangRef) -> GangRule:
        """The gang's minimum and timeout: its PodGroup's where one exists, else the pod's own labels."""
        if ref.source != LABEL_POD_GROUP:
            assert ref.min_member is not None  # KubeShare's labels always say
            return GangRule(ref.min_member, self.timeout_s)
        now = time.monotonic()
        with self._lock:
            known = self._rules.get(ref.key)
        if known is not None and now - known[0] < PODGROUP_TTL_S:
            return known[1]
        try:
            group = self._pod_groups.read(ref.namespace, ref.name, timeout_s=PODGROUP_READ_TIMEOUT_S)
        except NotFound:
            group = None  # no such PodGroup, or no PodGroup CRD in this cluster: the pod's annotation says
        except KubeError as exc:
            if known is not None:
                return known[1]  # the last answer stands while the API server does not answer
            raise RequestError(f"gang {ref.key}: {exc}") from None
        rule = self._rule_of(ref, group)
        with self._lock:
            self._rules.pop(ref.key, None)
            self._rules[ref.key] = (now, rule)
            while len(self._rules) > MAX_REMEMBERED_GROUPS:
                del self._rules[next(iter(self._rules))]
        return rule

    def _rule_of(self, ref: GangRef, group: dict[str, object] | None) -> GangRule:
        if group is None:
            if ref.min_member is None:
                raise RequestError(f"gang {ref.key}: the pods' label {LABEL_POD_GROUP} names PodGroup {ref.key}, which "
                                   "does not exist (or this cluster has no PodGroup CRD), and the pod has no "
                                   f"{ANN_GROUP_MIN_MEMBER} annotation; create the PodGroup, or set the annotation "
                                   "to the number of pods that must start together.")
            return GangRule(ref.min_member, self.timeout_s)
        spec = group.get("spec")
        spec = spec if isinstance(spec, dict) else {}
        minimum = spec.get("minMember", 0)
        timeout = spec.get("scheduleTimeoutSeconds")
        if not isinstance(minimum, int) or isinstance(minimum, bool) or minimum < 0:
            raise RequestError(f"gang {ref.key}: PodGroup {ref.key} has spec.minMember={clip(str(minimum))}; use a "
                               "whole number of 0 or more.")
        if timeout is not None and (not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 1):
            raise RequestError(f"gang {ref.key}: PodGroup {ref.key} has spec.scheduleTimeoutSeconds="
                               f"{clip(str(timeout))}; use a whole number of seconds of 1 or more.")
        # minMember 0 asks for no gang at all: each pod is placed alone, as with a minimum of 1.
        return GangRule(max(minimum, 1), float(timeout) if timeout is not None else self.timeout_s)

    # -- filter -----------------------------------------------------------------------------------------------

    def filter(self, pod: PodInfo, request: PodRequest, names: list[str]) -> FilterOutcome | None:
        """The gang's answer for one member; ``None`` when the pod is in no gang, or its gang has already
        started (then it is placed like any pod). ``RequestError`` when the gang's fields are wrong."""
        ref = read_gang(pod)
        if ref is None:
            return None
        held = self._cache.gang_hold(pod.key)
        if held is not None and held.uid == pod.uid:
            if held.node in names:
                return _only(names, held.node, f"gang {ref.key} planned this pod on node {held.node}")
            return _none(names, f"gang {ref.key} holds GPUs for this pod on node {held.node}, which kube-scheduler did "
                                "not offer this time (its own checks failed there, or it looked at part of the "
                                "cluster: set percentageOfNodesToScore: 100 for gangs)")
        rule = self.rule(ref)
        members = {m.key: m for m in self._index.members(ref.key)}
        members.setdefault(pod.key, pod)  # its filter may come before the watch shows it
        bound = [m for m in members.values() if m.node_name]
        holds = {r.pod_key for r in self._cache.gang_holds(ref.key)}
        if len(bound) + len(holds) >= rule.min_member:
            return None  # the gang has started: a further member is placed like any pod
        if len(members) < rule.min_member:
            self.rejections.labels("waiting").inc()
            return _none(names, f"gang {ref.key}: {len(members)} of {rule.min_member} members exist; waiting for "
                                f"{rule.min_member - len(members)} more")
        return self._plan(ref, rule, pod, request, names, members, len(bound), holds)  # None: no need to wait

    def _plan(self, ref: GangRef, rule: GangRule, pod: PodInfo, request: PodRequest, names: list[str],
              members: dict[str, PodInfo], bound: int, holds: set[str]) -> FilterOutcome | None:
        waiting = [m for m in members.values() if not m.node_name and m.key not in holds]
        planned: list[Member] = []
        uids: dict[str, tuple[str, PodRequest]] = {}
        without_gpu = 0
        evaluators: dict[str, Callable[[Node, PodRequest], Candidate | None]] = {}
        for member in waiting:
            try:
                wanted = request if member.key == pod.key else self._requests.request(member)
                policy = self._book.for_request(wanted)
            except ValueError:
                continue  # its own filter tells its owner; it cannot be placed, so it is not planned
            if not wanted.gpu_count:
                # A member without GPUs (an MPI launcher, say) is placed by kube-scheduler alone, never held back
                # by the extender: it counts as placed.
                without_gpu += 1
                continue
            # One evaluator per policy: the planner judges each node once per evaluator and request shape.
            evaluate = evaluators.setdefault(policy.name, self._evaluator(policy))
            planned.append(Member(member.key, wanted, evaluate))
            uids[member.key] = (member.uid, wanted)
        need = rule.min_member - bound - len(holds) - without_gpu
        if need <= 0:
            return None
        # Only nodes where some member fits now can take one (placing the others only takes room): the fit index
        # answers that in C-level passes, so a gang retried while it does not fit copies few nodes.
        usable: set[str] = set()
        for wanted in {shape_key(m.request): m.request for m in planned}.values():
            usable.update(self._cache.filter(names, wanted).passed)
        plan = plan_gang(self._cache.snapshot(n for n in names if n in usable), planned, need, self._cache.tie_seed)
        if not plan.placed:
            self.rejections.labels("unfit").inc()
            return _none(names, f"gang {ref.key}: {plan.fitted} of the {need} members it still needs fit the "
                                "cluster at once; nothing is held for it, and it waits for capacity")
        try:
            self._cache.hold_gang(ref.key, {key: (*uids[key], where.node, where.gpus)
                                            for key, where in plan.placed.items()})
        except ReservationError as exc:
            return _none(names, f"gang {ref.key}: its plan could not be held ({exc}); kube-scheduler will try again")
        timeout = rule.timeout_s
        with self._lock:
            self._plans[ref.key] = _Plan(time.monotonic() + timeout, timeout)
        self.plans.labels("held").inc()
        log.info("gang plan held", extra={"gang": ref.key, "members": len(plan.placed), "bound": bound})
        mine = plan.placed.get(pod.key)
        if mine is None:
            return _none(names, f"gang {ref.key} started without this pod, which does not fit with the others now")
        return _only(names, mine.node, f"gang {ref.key} planned this pod on node {mine.node}")

    def _evaluator(self, policy: Policy) -> Callable[[Node, PodRequest], Candidate | None]:
        book = self._book

        def evaluate(node: Node, request: PodRequest) -> Candidate | None:
            return book.evaluate(policy, node, request)

        return evaluate

    def planned_node(self, pod: PodInfo) -> str | None:
        """The node a gang's plan holds GPUs on for this pod, if any (prioritize ranks it first)."""
        held = self._cache.gang_hold(pod.key)
        return held.node if held is not None and held.uid == pod.uid else None

    # -- timeouts ---------------------------------------------------------------------------------------------

    def expire(self) -> None:
        """Forget plans whose members are all bound (or gone); release those past their deadline, with Events."""
        now = time.monotonic()
        with self._lock:
            plans = list(self._plans.items())
        for gang, plan in plans:
            holds = self._cache.gang_holds(gang)
            if holds and now < plan.deadline:
                continue
            with self._lock:
                if self._plans.get(gang) is plan:
                    del self._plans[gang]
            if not holds:
                self.plans.labels("completed").inc()
                continue
            for hold in holds:
                self._cache.release(hold)
            self.plans.labels("released").inc()
            members = {m.key: m for m in self._index.members(gang)}
            bound = sum(1 for m in members.values() if m.node_name)
            message = (f"gang {gang}: {len(holds)} of its members were not bound within {plan.timeout_s:g} s of its "
                       f"plan ({bound} were); gpushare released the GPUs it held for them, and the gang waits until "
                       "enough members fit at once again")
            log.warning(message, extra={"gang": gang})
            for hold in holds:
                member = members.get(hold.pod_key)
                if member is not None:
                    self._record_event(member, "GPUShareGangTimeout", message)

    def waiting(self) -> int:
        """Gangs with a pending member and no plan holding GPUs."""
        held = self._cache.held_gangs()
        return sum(1 for gang in self._index.pending_gangs() if gang not in held)

    def held_pods(self) -> int:
        return sum(len(self._cache.gang_holds(gang)) for gang in self._cache.held_gangs())


# A gang's refusals go in FailedAndUnresolvableNodes: evicting pods would not help (a gang member never preempts),
# so kube-scheduler skips its preemption dry run for them; the pod is retried all the same.
def _none(names: list[str], reason: str) -> FilterOutcome:
    return FilterOutcome([], {}, dict.fromkeys(names, reason))


def _only(names: list[str], node: str, reason: str) -> FilterOutcome:
    return FilterOutcome([node], {}, {n: reason for n in names if n != node})


def gang_of(pod: PodInfo) -> GangRef | None:
    """The pod's gang, ``None`` when it names none or names it wrongly (filter tells the owner why)."""
    try:
        return read_gang(pod)
    except RequestError:
        return None


class _GangCollector(Collector):
    def __init__(self, gangs: Gangs) -> None:
        self._gangs = gangs

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("gpushare_extender_gangs_waiting",
                                "Gangs with a pending member and no plan holding GPUs.", value=self._gangs.waiting())
        yield GaugeMetricFamily("gpushare_extender_gang_held_pods",
                                "Pods for which a gang's plan holds GPUs until they bind.",
                                value=self._gangs.held_pods())
