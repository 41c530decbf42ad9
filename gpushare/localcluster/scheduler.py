"""A scheduler loop that places pending pods the way kube-scheduler does with an HTTP extender.

What it reproduces (kube-scheduler v1.35, see ../shared/REFERENCE.md section 1b):

* **One pod at a time.** The scheduling cycle is serial; only binds run in the background, one thread per
  pod in flight, while the next pods are scheduled. A pod is *assumed* on its node as soon as the cycle
  picks it, so the next cycle already counts it; a failed bind forgets it and sends the pod to backoff.
* **Its own fit check first**: the pod's CPU, memory, pod-count and extended-resource requests
  (``aliyun.com/gpu-mem``, ``aliyun.com/gpu-count``: kube-scheduler accounts them because the extender's
  ``managedResources`` are not ``ignoredByScheduler``) against each Ready, schedulable node's allocatable
  minus the pods already there. Like kube-scheduler it stops at ``numFeasibleNodesToFind`` feasible nodes
  (all below 100 nodes, else ``percentageOfNodesToScore``, adaptive ``max(5, 50 - N/125)`` when 0, at least
  100), starting where the previous cycle stopped.
* Then, only for pods that ask for a resource the extender manages (in requests or limits of containers or
  init containers), POST ``<url>/filter`` with those nodes (``NodeNames`` when nodeCacheCapable, else the full
  ``Nodes``), POST ``<url>/prioritize`` (skipped when one node is left; its errors are ignored), and POST
  ``<url>/bind`` to the node with the best total of the loop's own scores and ``weight`` x 10 x the extender's
  score. A non-200 status or a non-empty ``Error`` fails the attempt: the pod gets a FailedScheduling Event and
  is retried with backoff (1 s doubling to 10 s). A pod that no node passed the loop's own checks for also
  waits, as among kube-scheduler's unschedulable pods, until a cluster event may have made room (a bound pod
  deleted or finished, a failed bind, a node added or changed) or 5 minutes passed. Events are written in the
  background, as kube-scheduler's event broadcaster does.
* **Its own scores**, wherever more than one node is left: kube-scheduler's default score plugins that tell the
  local cluster's nodes apart, NodeResourcesFit (least allocated CPU and memory, a container without requests
  counted as 100m and 200 MiB) and NodeResourcesBalancedAllocation, weight 1 each; the highest total wins, ties
  drawn with a seedable RNG, as its selectHost draws them.
* **Without an extender** (``extender_url=None``) every pod is placed by the loop's own checks and scores and
  bound directly: the floor that the extender's cost is measured against.

* **Preemption** after a FitError (no node passed its checks or the extender's filter), as kube-scheduler's
  DefaultPreemption does (REFERENCE.md section 1b): a pod with ``preemptionPolicy: Never`` waits. Otherwise a
  dry run on every node the extender did not call unresolvable removes all pods of lower priority from the
  loop's own accounting, checks the pod fits, then gives the pods back from the most important down while it
  still fits (``SelectVictimsOnNode``); nodes that need no victim are no candidates. The candidates go to
  ``<url>/preempt`` (``NodeNameToMetaVictims`` by UID when nodeCacheCapable, else ``NodeNameToVictims``),
  whose answer replaces them; a UID not on its node or an empty victim list fails the preemption. One node is
  picked by kube-scheduler's criteria (fewest PodDisruptionBudget violations, lowest highest-victim priority,
  smallest sum of priorities, fewest victims, latest start of the highest-priority victims), its victims are
  deleted, lower-priority pods nominated there lose their nomination, and the preemptor's
  ``status.nominatedNodeName`` is set; it is scheduled in a later cycle, once the victims' deletion freed
  their resources. Pods nominated to a node with at least a pod's priority count there in its checks.

What it leaves out: taints, affinity, topology spread and image locality (in filter and score alike: on the
local cluster's nodes those plugins would score every node the same), and the wait of a nominated pod for its
terminating victims (the local API server deletes at once). PodDisruptionBudgets count as in kube-scheduler,
with the status a test writes (the local cluster runs no disruption controller). Pods that request no GPU are
bound directly by this loop to a node that fits their CPU and memory (the best scored one), without the
extender, unless ``extender_for_all_pods`` is set: then they go through filter, prioritize and bind as well, as
with a kube-scheduler extender configuration that lists no ``managedResources``.
"""

from __future__ import annotations

import contextlib
import heapq
import http.client
import logging
import random
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpushare.contract import (
    MANAGED_RESOURCES,
    ContainerInfo,
    PodInfo,
    RequestError,
    host_requests,
    requests_gpu,
)
from gpushare.disruption import Budget, Candidate, violating
from gpushare.kube.api import Kube, KubeError, Obj
from gpushare.kube.convert import budget_info, pod_info
from gpushare.kube.informer import Informer
from gpushare.localcluster.extender_client import ExtenderClient
from gpushare.quantity import QuantityError, capacity_amount, to_int
from gpushare.schedconfig import DEFAULT_WEIGHT

log = logging.getLogger(__name__)

COMPONENT = "gpushare-local-scheduler"
EXTENDER_TIMEOUT_S = 5.0
MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10
# The extender weight at which the favourite of an extender that gives one node 10 and every other at most 9 wins
# whatever the loop's own two scores of 0-100 add: the gap is weight x 10, and 21 x 10 > 200.
DECISIVE_EXTENDER_WEIGHT = 2 * MAX_NODE_SCORE // (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY) + 1
INITIAL_BACKOFF_S = 1.0
MAX_BACKOFF_S = 10.0
# kube-scheduler's podMaxInUnschedulablePodsDuration, and how often it looks for pods parked longer than that.
MAX_UNSCHEDULABLE_S = 300.0
UNSCHEDULABLE_FLUSH_S = 30.0
SYNC_TIMEOUT_S = 30.0
# kube-scheduler's bounds on how many feasible nodes a cycle looks for (schedule_one.go).
MIN_FEASIBLE_NODES_TO_FIND = 100
MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND = 5
# Binds in flight at once. kube-scheduler starts a goroutine per pod without a limit; threads cost more, and
# a few dozen already exceed what one API server (or extender) answers concurrently.
MAX_BINDS_IN_FLIGHT = 64
# kube-scheduler's DefaultPreemption: the dry run stops after max(10% of the nodes, 100) candidates.
MIN_CANDIDATE_NODES_PERCENTAGE = 10
MIN_CANDIDATE_NODES_ABSOLUTE = 100
# Host reasons that no eviction can cure: such nodes are never preemption candidates.
UNRESOLVABLE = ("node(s) were not ready", "node(s) were unschedulable")
# The name of the thread that runs the serial cycles, by which a benchmark finds it among the process's threads.
SCHEDULING_THREAD = "scheduler-loop"


def num_feasible_nodes_to_find(all_nodes: int, percentage_of_nodes_to_score: int = 0) -> int:
    """kube-scheduler's ``numFeasibleNodesToFind``: how many feasible nodes one cycle looks for."""
    if all_nodes < MIN_FEASIBLE_NODES_TO_FIND:
        return all_nodes
    percentage = percentage_of_nodes_to_score
    if percentage == 0:
        percentage = max(50 - all_nodes // 125, MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND)
    return max(all_nodes * percentage // 100, MIN_FEASIBLE_NODES_TO_FIND)


@dataclass(frozen=True, slots=True)
class ScheduleResult:
    """The outcome of one scheduling attempt: the node the pod was bound to, or why it was not."""

    pod: str
    node: str | None
    message: str

    @property
    def scheduled(self) -> bool:
        return self.node is not None


@dataclass(slots=True)
class LoopStats:
    """What the loop measured, for benchmarks: the extender's time per cycle, each bind's latency, and how far each
    cycle's own checks went."""

    extender_ms: list[float] = field(default_factory=list)
    """Filter plus prioritize, as the loop waited for them, per cycle that called the extender."""
    bind_ms: list[float] = field(default_factory=list)
    nodes_checked: list[int] = field(default_factory=list)
    """The nodes each cycle's own checks went through to find ``numFeasibleNodesToFind`` (or all): the fuller the
    nodes that pods are packed onto, the more of them a cycle passes over."""


@dataclass(frozen=True, slots=True)
class _Attempt:
    """One scheduling cycle's outcome: the node the pod was assumed on, or why not."""

    node: str | None
    message: str
    requests: _Requests | None
    rejected_by_host_checks: bool = False
    """No node passed the loop's own checks, so no extender was asked: kube-scheduler parks such a pod among its
    unschedulable pods until a cluster event may have made room (see ``SchedulerLoop._retry_later``)."""


@dataclass(slots=True)
class _HostNode:
    """What the loop's own checks read from a node, plus the raw object for nodeCacheCapable: false."""

    name: str
    cpu_milli: int
    memory_mib: int
    pods: int
    extended: Mapping[str, int]
    ready: bool
    unschedulable: bool
    raw: Obj


@dataclass(frozen=True, slots=True)
class _Requests:
    """What a pod takes from its node, as kube-scheduler's NodeResourcesFit counts it."""

    cpu_milli: int = 0
    memory_mib: int = 0
    extended: Mapping[str, int] = field(default_factory=dict)
    priority: int = 0
    uid: str = ""
    started: str = ""
    """When the pod started (``status.startTime``, else its creation): preemption spares the older."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """What PodDisruptionBudgets select by."""
    scored_cpu_milli: int = 0
    scored_memory_mib: int = 0
    """CPU and memory as kube-scheduler's least-allocated score counts them (``host_requests(scored=True)``)."""


@dataclass(frozen=True, slots=True)
class _Candidate:
    """A node where preemption would let the pod fit, and the pods it would evict (most important first)."""

    node: str
    victims: list[tuple[str, _Requests]]
    pdb_violations: int = 0


@dataclass(slots=True)
class _Usage:
    cpu_milli: int = 0
    memory_mib: int = 0
    pods: int = 0
    extended: Counter[str] = field(default_factory=Counter)
    scored_cpu_milli: int = 0
    scored_memory_mib: int = 0
    """kube-scheduler's NonZeroRequested: the pods' ``_Requests.scored_*`` added up."""


# The usage of a node without pods, one value for all of them: read, never changed (``_account`` gives a node its own
# once a pod lands there). kube-scheduler's snapshot holds every node's usage, so an empty node costs its checks no
# more than a full one. A fresh value per read cost 0.7 us here: hundreds a cycle beside a policy that packs, which
# leaves most nodes empty, and in the floor's first cycles, while the cluster is empty (docs/throughput-history.md,
# round 64).
_NO_USAGE = _Usage()


def _extended_units(container: ContainerInfo, resource: str) -> int:
    # The API server has already refused malformed quantities; a container's requests default to its limits.
    try:
        return to_int(container.requests.get(resource, container.limits.get(resource, "0")))
    except QuantityError:
        return 0


def _requests(pod: PodInfo, started: str = "") -> _Requests:
    """CPU, memory and the extended resources gpushare manages, init containers counted as a maximum."""
    cpu, memory = host_requests(pod)
    scored_cpu, scored_memory = host_requests(pod, scored=True)
    extended: dict[str, int] = {}
    for resource in MANAGED_RESOURCES:
        total = sum(_extended_units(c, resource) for c in pod.containers)
        total = max([total, *(_extended_units(c, resource) for c in pod.init_containers)])
        if total:
            extended[resource] = total
    # kube-scheduler reads spec.priority alone (0 when unset); the extender's aliases are its own business.
    return _Requests(cpu, memory, extended, pod.priority or 0, pod.uid, started, pod.labels, scored_cpu,
                     scored_memory)


def _host_node(obj: Obj) -> _HostNode:
    status = obj.get("status") or {}
    allocatable = status.get("allocatable") or status.get("capacity") or {}
    conditions = status.get("conditions") or []
    ready_conditions = [c for c in conditions if c.get("type") == "Ready"]
    # A node that reports no conditions at all is taken as ready: nothing says otherwise.
    ready = not ready_conditions or ready_conditions[0].get("status") == "True"
    return _HostNode(name=obj["metadata"]["name"], cpu_milli=capacity_amount(allocatable, "cpu"),
                     memory_mib=capacity_amount(allocatable, "memory"),
                     pods=capacity_amount(allocatable, "pods"),
                     extended={r: capacity_amount(allocatable, r) for r in MANAGED_RESOURCES}, ready=ready,
                     unschedulable=bool((obj.get("spec") or {}).get("unschedulable")), raw=obj)


def _holds_resources(obj: Obj) -> bool:
    meta = obj.get("metadata") or {}
    phase = (obj.get("status") or {}).get("phase")
    return meta.get("deletionTimestamp") is None and phase not in ("Succeeded", "Failed")


def _started(obj: Obj) -> str:
    return str((obj.get("status") or {}).get("startTime") or (obj.get("metadata") or {}).get("creationTimestamp")
               or "")


def _pod_key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


class SchedulerLoop:
    """Schedules the local cluster's pending pods through a gpushare extender over HTTP (or, without one, alone).

    ``schedule_pod`` and ``schedule_once`` work synchronously without ``start`` (cycle and bind, one pod after the
    other); ``start`` adds a worker that runs kube-scheduler's pattern: serial cycles, binds in the background,
    backoff for pods that fail.
    """

    def __init__(self, api_client: client.ApiClient, extender_url: str | None, weight: int = DEFAULT_WEIGHT,
                 node_cache_capable: bool = True, seed: int | None = None, extender_for_all_pods: bool = False,
                 percentage_of_nodes_to_score: int = 0, tls: ssl.SSLContext | None = None) -> None:
        self._kube = Kube.from_api_client(api_client)
        self._core = client.CoreV1Api(api_client)
        self._policy = client.PolicyV1Api(api_client)
        self._url = extender_url.rstrip("/") if extender_url is not None else None
        self.weight = weight
        self.node_cache_capable = node_cache_capable
        self.extender_for_all_pods = extender_for_all_pods
        self.percentage_of_nodes_to_score = percentage_of_nodes_to_score
        self._rng = random.Random(seed)
        # ``tls``: kube-scheduler's tlsConfig, the CA it trusts and the client certificate it presents.
        self._extender = (ExtenderClient(self._url, EXTENDER_TIMEOUT_S, tls) if self._url is not None else None)
        self._lock = threading.Lock()
        self._nodes: dict[str, _HostNode] = {}
        self._node_order: list[str] = []
        self._next_start = 0
        self._bound: dict[str, tuple[str, _Requests]] = {}
        # The same pods by node, as kube-scheduler's NodeInfo lists them: a preemption's dry run reads each node's
        # pods, and scanning every bound pod per node cost seconds per attempt on a full cluster.
        self._on_node: dict[str, dict[str, _Requests]] = {}
        self._usage: dict[str, _Usage] = {}
        self._pending: dict[str, Obj] = {}
        self._nominated: dict[str, tuple[str, _Requests]] = {}
        self._binding: set[str] = set()
        self._backoff: dict[str, float] = {}
        self._queue: list[tuple[float, str]] = []
        # Pods that no node passed the loop's own checks for, and since when: kube-scheduler's unschedulable pods.
        self._parked: dict[str, float] = {}
        self._next_flush = 0.0
        # Events that may have made room, counted: one during a pod's cycle means it must not be parked.
        self._room_events = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._schedule_lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self._binds = ThreadPoolExecutor(MAX_BINDS_IN_FLIGHT, thread_name_prefix="scheduler-bind")
        self._events = ThreadPoolExecutor(1, thread_name_prefix="scheduler-events")
        self._node_informer = Informer(self._kube.nodes.list_call, on_sync=self._sync_nodes,
                                       on_event=self._node_event, kind="nodes")
        self._pod_informer = Informer(self._kube.pods.list_call, on_sync=self._sync_pods,
                                      on_event=self._pod_event, kind="pods")
        self._watching = False
        self.stats = LoopStats()

    # -- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> None:
        """Watch the cluster and schedule pending pods in the background until ``stop``."""
        self._ensure_watching()
        self._stop.clear()
        self._worker = threading.Thread(target=self._run, name=SCHEDULING_THREAD, daemon=True)
        self._worker.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._worker is not None:
            self._worker.join(timeout=10)
            self._worker = None
        self._binds.shutdown(wait=True)
        self._events.shutdown(wait=True)
        if self._watching:
            self._pod_informer.stop()
            self._node_informer.stop()
            self._watching = False
        if self._extender is not None:
            self._extender.close()

    def __enter__(self) -> SchedulerLoop:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _ensure_watching(self) -> None:
        if not self._watching:
            self._node_informer.start()
            self._pod_informer.start()
            self._watching = True
        if not (self._node_informer.synced.wait(SYNC_TIMEOUT_S) and self._pod_informer.synced.wait(SYNC_TIMEOUT_S)):
            raise TimeoutError(f"The scheduler loop could not list nodes and pods within {SYNC_TIMEOUT_S:.0f} s; "
                               "is the API server up?")

    # -- scheduling ----------------------------------------------------------------------------------------

    def schedule_once(self) -> list[ScheduleResult]:
        """Try every pending pod once, highest priority and oldest first, each bound before the next."""
        self._ensure_watching()
        with self._lock:
            pending = sorted(self._pending.values(), key=_queue_order)
        return [self.schedule_pod(obj["metadata"]["name"], obj["metadata"].get("namespace") or "default")
                for obj in pending]

    def schedule_pod(self, name: str, namespace: str = "default") -> ScheduleResult:
        """Schedule one pod now, bind included; on failure record a FailedScheduling Event and return why."""
        self._ensure_watching()
        key = f"{namespace}/{name}"
        try:
            obj = self._kube.pods.read(namespace, name)
        except KubeError as exc:
            return ScheduleResult(key, None, str(exc))
        bound = (obj.get("spec") or {}).get("nodeName")
        if bound:
            return ScheduleResult(key, bound, f"pod {key} is already bound to node {bound}")
        if not _holds_resources(obj):
            return ScheduleResult(key, None, f"pod {key} is terminating or has finished")
        with self._schedule_lock:
            attempt = self._cycle(obj)
        node, requests = attempt.node, attempt.requests
        if node is None or requests is None:
            return self._failed(obj, attempt.message)
        return self._bind(obj, node, requests)

    def _cycle(self, obj: Obj) -> _Attempt:
        """One scheduling cycle: the node for the pod, assumed there at once; or ``None`` and why not."""
        pod = pod_info(obj)
        try:
            requests = _requests(pod, _started(obj))
            wants_gpu = requests_gpu(pod)
        except RequestError as exc:
            return _Attempt(None, str(exc), None)
        key = _pod_key(obj)
        feasible, reasons, total = self._host_feasible(key, requests)
        if not feasible:
            message = self._preempt(obj, pod, requests, wants_gpu, set(), _unavailable(total, reasons))
            return _Attempt(None, message, None, rejected_by_host_checks=True)
        if self._url is None or (not wants_gpu and not self.extender_for_all_pods):
            best = self._select_host(feasible, requests, {})
            self._assume(key, best, requests)
            return _Attempt(best, "", requests)
        asked = time.perf_counter()
        names, failed, unresolvable, error = self._filter(obj, feasible)
        if error:
            return _Attempt(None, error, None)  # an error, not a FitError: kube-scheduler does not preempt
        reasons.update(failed)
        if not names:
            return _Attempt(None, self._preempt(obj, pod, requests, wants_gpu, unresolvable,
                                                _unavailable(total, reasons)), None)
        extender_scores = self._prioritize(obj, feasible, names) if len(names) > 1 else {}
        self.stats.extender_ms.append(1000 * (time.perf_counter() - asked))
        if len(names) == 1:
            best = names[0]  # nothing to score, and no need to look the one name up among the feasible nodes
        else:
            passed = set(names)
            best = self._select_host([n for n in feasible if n.name in passed], requests, extender_scores)
        self._assume(key, best, requests)
        return _Attempt(best, "", requests)

    def _select_host(self, nodes: list[_HostNode], requests: _Requests, extender_scores: Mapping[str, int]) -> str:
        """kube-scheduler's prioritizeNodes and selectHost over the nodes left: with one, that one; else its own
        scores (``_default_scores``) plus the extender's, the highest total winning, ties drawn at random."""
        if len(nodes) == 1:
            return nodes[0].name
        with self._lock:
            scores = _default_scores(nodes, self._usage, requests)
        totals = [score + extender_scores.get(node.name, 0) for node, score in zip(nodes, scores, strict=True)]
        top = max(totals)
        return self._rng.choice([node.name for node, total in zip(nodes, totals, strict=True) if total == top])

    def _host_feasible(self, key: str, requests: _Requests) -> tuple[list[_HostNode], Counter[str], int]:
        """kube-scheduler's own checks, stopping at ``numFeasibleNodesToFind`` nodes; also the node count."""
        feasible: list[_HostNode] = []
        reasons: Counter[str] = Counter()
        with self._lock:
            order = self._node_order
            total = len(order)
            wanted = num_feasible_nodes_to_find(total, self.percentage_of_nodes_to_score)
            processed = 0
            for i in range(total):
                if len(feasible) >= wanted:
                    break
                node = self._nodes[order[(self._next_start + i) % total]]
                processed += 1
                reason = self._misfit(node, requests, self._used_with_nominated(node.name, key, requests.priority))
                if reason is None:
                    feasible.append(node)
                else:
                    reasons[reason] += 1
            if total:
                self._next_start = (self._next_start + processed) % total
            self.stats.nodes_checked.append(processed)
        return feasible, reasons, total

    def _used_with_nominated(self, node: str, key: str, priority: int) -> _Usage:
        """The node's usage plus the pods nominated to it with at least ``priority`` (kube-scheduler counts
        them as there: the room a preemption freed is theirs); call with the lock held."""
        used = self._usage.get(node, _NO_USAGE)
        held = [r for k, (n, r) in self._nominated.items() if n == node and k != key and r.priority >= priority]
        if not held:
            return used
        total = _Usage(used.cpu_milli, used.memory_mib, used.pods, Counter(used.extended), used.scored_cpu_milli,
                       used.scored_memory_mib)
        for r in held:
            total.cpu_milli += r.cpu_milli
            total.memory_mib += r.memory_mib
            total.pods += 1
            total.extended.update(r.extended)
        return total

    @staticmethod
    def _misfit(node: _HostNode, requests: _Requests, used: _Usage) -> str | None:
        if not node.ready:
            return "node(s) were not ready"
        if node.unschedulable:
            return "node(s) were unschedulable"
        if node.pods and used.pods + 1 > node.pods:
            return "Too many pods"
        if requests.cpu_milli and used.cpu_milli + requests.cpu_milli > node.cpu_milli:
            return "Insufficient cpu"
        if requests.memory_mib and used.memory_mib + requests.memory_mib > node.memory_mib:
            return "Insufficient memory"
        for resource, amount in requests.extended.items():
            if used.extended.get(resource, 0) + amount > node.extended.get(resource, 0):
                return f"Insufficient {resource}"
        return None

    # -- preemption: kube-scheduler's DefaultPreemption PostFilter -------------------------------------------

    def _preempt(self, obj: Obj, pod: PodInfo, requests: _Requests, wants_gpu: bool, unresolvable: set[str],
                 message: str) -> str:
        """After a FitError: evict lower-priority pods somewhere and nominate the pod there; the failure message,
        with kube-scheduler's preemption sentence when nothing could be preempted."""
        if pod.preemption_policy == "Never":
            return f"{message} preemption: not eligible due to preemptionPolicy=Never."
        candidates = self._dry_run(_pod_key(obj), requests, unresolvable, self._budgets())
        if candidates and self._url is not None and (wants_gpu or self.extender_for_all_pods):
            candidates, error = self._extender_preempt(obj, candidates)
            if error:
                return f"{message} preemption: {error}"
        if not candidates:
            with self._lock:
                helpless = Counter("Preemption is not helpful for scheduling" if (
                    name in unresolvable or not node.ready or node.unschedulable)
                    else "No preemption victims found for incoming pod" for name, node in self._nodes.items())
            return f"{message} preemption: {_unavailable(len(self._nodes), helpless)}"
        error = self._prepare(obj, _pick_one(candidates), requests.priority)
        return f"{message} preemption: {error}" if error else message

    def _budgets(self) -> list[Budget]:
        """The PodDisruptionBudgets, read once per preemption as kube-scheduler reads its lister."""
        try:
            listed: Any = self._policy.list_pod_disruption_budget_for_all_namespaces(_preload_content=False)
        except ApiException:
            return []
        return [budget_info(o) for o in orjson.loads(listed.data).get("items") or []]

    def _dry_run(self, key: str, requests: _Requests, unresolvable: set[str],
                 budgets: list[Budget]) -> list[_Candidate]:
        """``SelectVictimsOnNode`` on each node that eviction could help, up to kube-scheduler's candidate count.

        Victims that would violate a PodDisruptionBudget are reprieved first, and those that remain are counted.
        """
        with self._lock:
            order = self._node_order
            wanted = min(max(len(order) * MIN_CANDIDATE_NODES_PERCENTAGE // 100, MIN_CANDIDATE_NODES_ABSOLUTE),
                         len(order))
            candidates: list[_Candidate] = []
            for name in order:
                node = self._nodes[name]
                if len(candidates) >= wanted:
                    break
                if name in unresolvable or not node.ready or node.unschedulable:
                    continue
                lower = sorted(((k, r) for k, r in self._on_node.get(name, {}).items()
                                if r.priority < requests.priority), key=_importance)
                used = self._used_with_nominated(name, key, requests.priority)
                for _, r in lower:
                    used = _shifted(used, r, -1)
                if self._misfit(node, requests, used) is not None:
                    continue  # even without every lower-priority pod the pod does not fit
                flags = violating([Candidate.of(k, r.labels) for k, r in lower], budgets)
                victims: list[tuple[str, _Requests]] = []
                violations = 0
                # Reprieve the violating pods first, then the others, most important first, while the pod fits.
                for pass_violators in (True, False):
                    for (k, r), flag in zip(lower, flags, strict=True):
                        if flag is not pass_violators:
                            continue
                        kept = _shifted(used, r, 1)
                        if self._misfit(node, requests, kept) is None:
                            used = kept
                        else:
                            victims.append((k, r))
                            violations += flag
                if victims:  # a node that needs no victim is no candidate (kube-scheduler: "expected at least one")
                    victims.sort(key=_importance)
                    candidates.append(_Candidate(name, victims, violations))
        return candidates

    def _extender_preempt(self, obj: Obj, candidates: list[_Candidate]) -> tuple[list[_Candidate], str]:
        """The extender's preempt verb: its victims replace the dry run's; nodes it leaves out are vetoed."""
        if self.node_cache_capable:
            payload: dict[str, Any] = {"Pod": obj, "NodeNameToVictims": None, "NodeNameToMetaVictims": {
                c.node: {"Pods": [{"UID": r.uid} for _, r in c.victims], "NumPDBViolations": c.pdb_violations}
                for c in candidates}}
        else:
            payload = {"Pod": obj, "NodeNameToMetaVictims": None, "NodeNameToVictims": {
                c.node: {"Pods": [self._kube.pods.read(*reversed(k.split("/", 1))) for k, _ in c.victims],
                         "NumPDBViolations": c.pdb_violations} for c in candidates}}
        answer, error = self._call("preempt", payload)
        if error:
            return [], error
        if not isinstance(answer, dict) or not isinstance(answer.get("NodeNameToMetaVictims") or {}, dict):
            return [], "the extender's preempt answer is not an ExtenderPreemptionResult"
        result: list[_Candidate] = []
        with self._lock:
            for node, meta in (answer.get("NodeNameToMetaVictims") or {}).items():
                pods = (meta or {}).get("Pods") or []
                if not pods:
                    return [], f"expected at least one victim pod on node {node}"
                on_node = {r.uid: (k, r) for k, r in self._on_node.get(node, {}).items()}
                victims = []
                for victim in pods:
                    uid = (victim or {}).get("UID")
                    if uid not in on_node:
                        return [], (f"extender claims to preempt pod (UID: {uid}) on node: {node}, but the pod is "
                                    "not found on that node")
                    victims.append(on_node[uid])
                result.append(_Candidate(str(node), victims, int((meta or {}).get("NumPDBViolations") or 0)))
        return result, ""

    def _prepare(self, obj: Obj, chosen: _Candidate, priority: int) -> str:
        """Evict the victims, take lower-priority nominations off the node, and nominate the pod; an error or ''."""
        meta = obj["metadata"]
        namespace, uid = meta.get("namespace") or "default", str(meta.get("uid") or "")
        for key, r in chosen.victims:
            victim_namespace, name = key.split("/", 1)
            try:
                self._core.delete_namespaced_pod(name, victim_namespace, body=client.V1DeleteOptions(
                    preconditions=client.V1Preconditions(uid=r.uid)))
            except ApiException as exc:
                if exc.status != 404:
                    return f"deleting victim {key} failed: HTTP {exc.status}"
            self._event({"metadata": {"name": name, "namespace": victim_namespace, "uid": r.uid}}, "Preempted",
                        f"Preempted by pod {uid} on node {chosen.node}", "Normal")
        with self._lock:
            displaced = [k for k, (n, r) in self._nominated.items() if n == chosen.node and r.priority < priority]
        for key in displaced:
            self._nominate(key, None)
        return self._nominate(f"{namespace}/{meta['name']}", chosen.node)

    def _nominate(self, key: str, node: str | None) -> str:
        """Set (or clear) the pod's ``status.nominatedNodeName``; an error sentence or ''."""
        namespace, name = key.split("/", 1)
        try:
            self._core.patch_namespaced_pod_status(name, namespace, {"status": {"nominatedNodeName": node}})
        except ApiException as exc:
            if exc.status != 404:
                return f"setting the nominated node of {key} failed: HTTP {exc.status}"
        return ""

    def _call(self, verb: str, payload: Any) -> tuple[Any, str]:
        """POST a verb; the decoded answer, or an error sentence as kube-scheduler would report it."""
        if self._extender is None:
            return None, f"the {verb} call has no extender to go to"
        try:
            status, data = self._extender.post(verb, orjson.dumps(payload))
        except (OSError, http.client.HTTPException) as exc:
            return None, f"the extender's {verb} call failed: {exc!r}"
        if status != 200:
            text = data.decode(errors="replace").strip()
            return None, f"the extender's {verb} call answered HTTP {status}: {text}"
        try:
            return orjson.loads(data), ""
        except orjson.JSONDecodeError:
            return None, f"the extender's {verb} answer is not JSON"

    def _args(self, obj: Obj, nodes: Iterable[_HostNode]) -> dict[str, Any]:
        if self.node_cache_capable:
            return {"Pod": obj, "Nodes": None, "NodeNames": [n.name for n in nodes]}
        return {"Pod": obj, "Nodes": {"metadata": {}, "items": [n.raw for n in nodes]}, "NodeNames": None}

    def _filter(self, obj: Obj, nodes: list[_HostNode]) -> tuple[list[str], dict[str, int], set[str], str]:
        """The nodes that passed, the failure messages counted, the nodes failed as unresolvable, or an error."""
        answer, error = self._call("filter", self._args(obj, nodes))
        if error:
            return [], {}, set(), error
        if not isinstance(answer, dict):
            return [], {}, set(), "the extender's filter answer is not an ExtenderFilterResult"
        if answer.get("Error"):
            return [], {}, set(), str(answer["Error"])
        sent = {n.name for n in nodes}
        if self.node_cache_capable:
            names = answer.get("NodeNames") or []
        else:
            names = [i["metadata"]["name"] for i in (answer.get("Nodes") or {}).get("items") or []]
        failed: Counter[str] = Counter()
        for group in ("FailedNodes", "FailedAndUnresolvableNodes"):
            for message in (answer.get(group) or {}).values():
                failed[str(message)] += 1
        unresolvable = set(answer.get("FailedAndUnresolvableNodes") or {})
        return [n for n in names if n in sent], dict(failed), unresolvable, ""

    def _prioritize(self, obj: Obj, nodes: list[_HostNode], names: list[str]) -> dict[str, int]:
        keep = set(names)
        answer, error = self._call("prioritize", self._args(obj, [n for n in nodes if n.name in keep]))
        if error or not isinstance(answer, list):
            log.warning("ignoring the extender's prioritize failure, as kube-scheduler does: %s", error)
            return {}
        scale = MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY
        return {str(h["Host"]): int(h["Score"]) * self.weight * scale for h in answer
                if isinstance(h, dict) and h.get("Host") in keep}

    def _bind(self, obj: Obj, node: str, requests: _Requests) -> ScheduleResult:
        """Bind an assumed pod (through the extender when it binds GPU pods); forget the assumption on failure."""
        meta = obj["metadata"]
        key = _pod_key(obj)
        namespace, uid = meta.get("namespace") or "default", str(meta.get("uid") or "")
        error = ""
        started = time.perf_counter()
        if self._url is not None and (self.extender_for_all_pods or requests.extended):
            answer, error = self._call("bind", {"PodName": meta["name"], "PodNamespace": namespace, "PodUID": uid,
                                                "Node": node})
            if not error and isinstance(answer, dict) and answer.get("Error"):
                error = str(answer["Error"])
        else:
            try:
                self._kube.pods.bind(namespace, meta["name"], uid, node)
            except KubeError as exc:
                error = str(exc)
        self.stats.bind_ms.append(1000 * (time.perf_counter() - started))
        if error:
            self._forget(key, obj)
            return self._failed(obj, error)
        message = f"Successfully assigned {key} to {node}"
        self._event(obj, "Scheduled", message, "Normal")
        return ScheduleResult(key, node, message)

    def _failed(self, obj: Obj, message: str) -> ScheduleResult:
        key = _pod_key(obj)
        self._event(obj, "FailedScheduling", message, "Warning")
        log.info("pod not scheduled", extra={"pod": key, "reason": message[:500]})
        return ScheduleResult(key, None, message)

    def _event(self, obj: Obj, reason: str, message: str, event_type: str) -> None:
        """Record an Event in the background, as kube-scheduler's broadcaster does: never in the cycle's way."""
        meta = obj["metadata"]
        self._events.submit(self._kube.pods.record_event, meta.get("namespace") or "default", meta["name"],
                            str(meta.get("uid") or ""), reason=reason, message=message, component=COMPONENT,
                            event_type=event_type)

    def bound_pods(self) -> int:
        """Pods this loop's view holds bound to a node, its own binds in flight excluded."""
        with self._lock:
            return len(self._bound) - len(self._binding)

    def extender_connections(self) -> int:
        """Connections opened to the extender so far: kube-scheduler's client keeps two idle (``ExtenderClient``)."""
        return 0 if self._extender is None else self._extender.opened

    def wait_for_events(self) -> None:
        """Return once every Event recorded so far has been written (tests read them back)."""
        self._events.submit(lambda: None).result()

    # -- the loop's view of the cluster --------------------------------------------------------------------

    def _assume(self, key: str, node: str, requests: _Requests) -> None:
        """Count a pod on its node at once, as kube-scheduler's assume cache does, before the watch shows it."""
        with self._lock:
            self._account(key, (node, requests))
            self._pending.pop(key, None)
            self._binding.add(key)

    def _forget(self, key: str, obj: Obj) -> None:
        """Undo ``_assume`` after a failed bind; the pod is pending again, as the API still says."""
        with self._lock:
            if key not in self._binding:
                return  # the watch already shows the pod bound: the bind went through, only its answer failed
            self._binding.discard(key)
            self._account(key, None)
            self._pending[key] = obj

    def _account(self, key: str, entry: tuple[str, _Requests] | None) -> None:
        old = self._bound.pop(key, None)
        if old is not None:
            self._on_node[old[0]].pop(key, None)
            if entry is None:
                self._unpark()  # kube-scheduler's AssignedPodDelete (a failed bind's forgotten pod counts too)
            usage = self._usage[old[0]]
            usage.cpu_milli -= old[1].cpu_milli
            usage.memory_mib -= old[1].memory_mib
            usage.scored_cpu_milli -= old[1].scored_cpu_milli
            usage.scored_memory_mib -= old[1].scored_memory_mib
            usage.extended.subtract(old[1].extended)
            usage.pods -= 1
        if entry is not None:
            self._bound[key] = entry
            self._on_node.setdefault(entry[0], {})[key] = entry[1]
            usage = self._usage.setdefault(entry[0], _Usage())
            usage.cpu_milli += entry[1].cpu_milli
            usage.memory_mib += entry[1].memory_mib
            usage.scored_cpu_milli += entry[1].scored_cpu_milli
            usage.scored_memory_mib += entry[1].scored_memory_mib
            usage.extended.update(entry[1].extended)
            usage.pods += 1

    def _sync_nodes(self, items: list[Obj]) -> None:
        with self._lock:
            self._nodes = {n.name: n for n in map(_host_node, items)}
            self._node_order = list(self._nodes)
            self._unpark()

    def _node_event(self, kind: str, obj: Obj) -> None:
        with self._lock:
            name = obj["metadata"]["name"]
            if kind == "DELETED":
                if self._nodes.pop(name, None) is not None:
                    self._node_order.remove(name)
            else:
                if name not in self._nodes:
                    self._node_order.append(name)
                old, new = self._nodes.get(name), _host_node(obj)
                self._nodes[name] = new
                if old is None or replace(old, raw={}) != replace(new, raw={}):
                    self._unpark()  # a node added, or one whose room or readiness changed; not a heartbeat
        self._wake.set()

    def _sync_pods(self, items: list[Obj]) -> None:
        with self._lock:
            for key in [k for k in self._bound if k not in self._binding]:
                self._account(key, None)
            self._pending.clear()
            self._nominated.clear()
            for obj in items:
                self._track(obj)
        self._wake.set()

    def _pod_event(self, kind: str, obj: Obj) -> None:
        with self._lock:
            if kind == "DELETED":
                key = _pod_key(obj)
                self._nominated.pop(key, None)
                self._account(key, None)
                self._pending.pop(key, None)
                self._backoff.pop(key, None)
                self._parked.pop(key, None)
                self._binding.discard(key)
            else:
                self._track(obj)
        self._wake.set()

    def _track(self, obj: Obj) -> None:
        key = _pod_key(obj)
        node = (obj.get("spec") or {}).get("nodeName")
        nominated = (obj.get("status") or {}).get("nominatedNodeName")
        self._nominated.pop(key, None)
        if nominated and not node and _holds_resources(obj):
            # A pod whose request cannot be read never fits anywhere, so it holds no room either.
            with contextlib.suppress(RequestError):
                self._nominated[key] = (str(nominated), _requests(pod_info(obj), _started(obj)))
        if not _holds_resources(obj):
            self._account(key, None)
            self._pending.pop(key, None)
            self._parked.pop(key, None)
        elif node:
            try:
                requests = _requests(pod_info(obj), _started(obj))
            except RequestError:
                requests = _Requests()
            self._account(key, (node, requests))
            self._pending.pop(key, None)
            self._backoff.pop(key, None)
            self._parked.pop(key, None)
            self._binding.discard(key)
        elif key in self._binding:
            return  # assumed by a cycle; its bind is in flight and settles it
        else:
            before = self._pending.get(key)
            if before is None and key not in self._backoff:
                heapq.heappush(self._queue, (0.0, key))
            elif key in self._parked and before is not None and before.get("spec") != obj.get("spec"):
                self._requeue(key)  # the pod itself changed: it may fit now
            self._pending[key] = obj

    # -- background worker ---------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            key = self._next_ready()
            if key is None:
                continue
            with self._lock:
                obj = self._pending.get(key)
                room_events = self._room_events
            if obj is None:
                continue
            try:
                with self._schedule_lock:
                    attempt = self._cycle(obj)
            except Exception:  # the loop must survive anything one pod does
                log.exception("scheduling a pod failed unexpectedly", extra={"pod": key})
                attempt = _Attempt(None, "unexpected error", None)
            if attempt.node is None or attempt.requests is None:
                self._failed(obj, attempt.message)
                self._retry_later(key, park=attempt.rejected_by_host_checks, room_events=room_events)
                continue
            self._binds.submit(self._bind_in_background, obj, attempt.node, attempt.requests)

    def _bind_in_background(self, obj: Obj, node: str, requests: _Requests) -> None:
        try:
            result = self._bind(obj, node, requests)
        except Exception:
            log.exception("binding a pod failed unexpectedly", extra={"pod": _pod_key(obj)})
            self._forget(_pod_key(obj), obj)
            result = ScheduleResult(_pod_key(obj), None, "unexpected error")
        if not result.scheduled:
            self._retry_later(result.pod)
            self._wake.set()

    def _next_ready(self) -> str | None:
        """The next pod whose backoff has passed, waiting at most until then (or a watch event)."""
        with self._lock:
            now = time.monotonic()
            if self._parked and now >= self._next_flush:
                self._next_flush = now + UNSCHEDULABLE_FLUSH_S
                for key in [k for k, since in self._parked.items() if now - since >= MAX_UNSCHEDULABLE_S]:
                    self._requeue(key)
            while self._queue:
                ready_at, key = self._queue[0]
                if key not in self._pending or key in self._parked:
                    heapq.heappop(self._queue)
                    continue
                delay = ready_at - time.monotonic()
                if delay <= 0:
                    heapq.heappop(self._queue)
                    return key
                break
            else:
                delay = 1.0
        self._wake.wait(delay)
        self._wake.clear()
        return None

    def _retry_later(self, key: str, park: bool = False, room_events: int = 0) -> None:
        """Back the pod off, 1 s doubling to 10 s; with ``park``, it also waits for a cluster event that may have
        made room (``_unpark``), or ``MAX_UNSCHEDULABLE_S``, unless such an event came since the count
        ``room_events`` read before its cycle: room freed meanwhile (a preemption's own victims, say) is room the
        pod has not tried, so it only backs off (kube-scheduler's moveRequestCycle).

        kube-scheduler holds a pod its own plugins rejected among its unschedulable pods until their queueing hints
        see such an event: retrying it after every backoff would run a full search and a preemption dry run over
        every node each time, which no real cluster pays. A pod only the extender rejected carries no plugin's
        hint, and kube-scheduler requeues it on any event: in a cluster that schedules, its backoff.
        """
        with self._lock:
            if key not in self._pending:
                return
            backoff = min(self._backoff.get(key, INITIAL_BACKOFF_S / 2) * 2, MAX_BACKOFF_S)
            self._backoff[key] = backoff
            if park and room_events == self._room_events:
                self._parked[key] = time.monotonic()
            else:
                heapq.heappush(self._queue, (time.monotonic() + backoff, key))

    def _unpark(self) -> None:
        """Requeue every parked pod: something freed room, or a node changed (call with the lock held)."""
        self._room_events += 1
        for key in list(self._parked):
            self._requeue(key)

    def _requeue(self, key: str) -> None:
        """A parked pod back in the queue, once its backoff from when it was parked has passed (lock held)."""
        since = self._parked.pop(key)
        heapq.heappush(self._queue, (since + self._backoff.get(key, 0.0), key))


def _default_scores(nodes: list[_HostNode], usage: Mapping[str, _Usage], requests: _Requests) -> list[int]:
    """kube-scheduler's default score plugins that tell these nodes apart, each of weight 1, per node.

    NodeResourcesFit's LeastAllocated: the unrequested share of CPU and of memory, as 0-100 and averaged, counting
    what containers set no request for as kube-scheduler's scoring does. NodeResourcesBalancedAllocation: 100 less
    half the gap between the requested shares of CPU and memory as percent, skipped (its PreScore) for a pod that
    requests neither. The plugins left out (taints, affinities, topology spread, image locality) score every node
    of the local cluster alike. Memory is counted in MiB, not bytes: the same scores where allocatable memory is a
    whole number of MiB. Written out per node rather than per resource: it runs over hundreds of nodes a cycle.
    """
    cpu, memory = requests.scored_cpu_milli, requests.scored_memory_mib
    balanced = bool(requests.cpu_milli or requests.memory_mib)
    scores = []
    for node in nodes:
        used = usage.get(node.name, _NO_USAGE)
        cpu_total, memory_total = node.cpu_milli, node.memory_mib
        cpu_taken, memory_taken = used.scored_cpu_milli + cpu, used.scored_memory_mib + memory
        if cpu_total > 0 and memory_total > 0:
            score = (((cpu_total - cpu_taken) * MAX_NODE_SCORE // cpu_total if cpu_taken <= cpu_total else 0)
                     + ((memory_total - memory_taken) * MAX_NODE_SCORE // memory_total
                        if memory_taken <= memory_total else 0)) // 2
            if balanced:
                cpu_share = min((used.cpu_milli + requests.cpu_milli) / cpu_total, 1.0)
                memory_share = min((used.memory_mib + requests.memory_mib) / memory_total, 1.0)
                score += int((1 - abs(cpu_share - memory_share) / 2) * MAX_NODE_SCORE)
        else:
            # A node that reports no CPU or no memory: the other counts alone, and one share is always balanced.
            total, taken = (cpu_total, cpu_taken) if cpu_total > 0 else (memory_total, memory_taken)
            score = (total - taken) * MAX_NODE_SCORE // total if total > 0 and taken <= total else 0
            score += MAX_NODE_SCORE if balanced else 0
        scores.append(score)
    return scores


def _importance(item: tuple[str, _Requests]) -> tuple[int, str]:
    """kube-scheduler's MoreImportantPod order: higher priority first, then the one that started earlier."""
    return -item[1].priority, item[1].started


def _shifted(used: _Usage, requests: _Requests, sign: int) -> _Usage:
    """``used`` with one pod's requests added (``sign`` 1) or taken away (-1), as a new value."""
    extended = Counter(used.extended)
    for resource, amount in requests.extended.items():
        extended[resource] += sign * amount
    return _Usage(used.cpu_milli + sign * requests.cpu_milli, used.memory_mib + sign * requests.memory_mib,
                  used.pods + sign, extended, used.scored_cpu_milli + sign * requests.scored_cpu_milli,
                  used.scored_memory_mib + sign * requests.scored_memory_mib)


def _pick_one(candidates: list[_Candidate]) -> _Candidate:
    """kube-scheduler's pickOneNodeForPreemption: each criterion narrows the field until one node is left.

    Like kube-scheduler it takes a node's first victim as its highest-priority one, as the victims are listed.
    """
    def earliest_top_start(c: _Candidate) -> str:
        top = c.victims[0][1].priority
        return min(r.started for _, r in c.victims if r.priority == top)

    criteria: list[Callable[[_Candidate], Any]] = [
        lambda c: -c.pdb_violations,
        lambda c: -c.victims[0][1].priority,
        lambda c: -sum(r.priority + 2**31 for _, r in c.victims),
        lambda c: -len(c.victims),
        earliest_top_start,  # the latest of these wins: the victims that have run the shortest
    ]
    field = candidates
    for score in criteria:
        best = max(score(c) for c in field)
        field = [c for c in field if score(c) == best]
        if len(field) == 1:
            break
    return field[0]


def _queue_order(obj: Obj) -> tuple[int, str, str]:
    spec = obj.get("spec") or {}
    meta = obj.get("metadata") or {}
    return (-int(spec.get("priority") or 0), str(meta.get("creationTimestamp") or ""), _pod_key(obj))


def _unavailable(total: int, reasons: Counter[str] | dict[str, int]) -> str:
    """kube-scheduler's summary: '0/N nodes are available: 2 Insufficient cpu, 1 <extender message>.'"""
    parts = [f"{count} {reason}" for reason, count in sorted(reasons.items(), key=lambda r: (-r[1], r[0]))]
    return f"0/{total} nodes are available: {', '.join(parts) or 'no nodes'}."
