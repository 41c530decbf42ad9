"""A scheduler loop that places pending pods the way kube-scheduler does with an HTTP extender.

What it reproduces: the pod's CPU, memory and pod-count requests checked against each Ready, schedulable
node's allocatable minus the pods already there; then, only for pods that ask for a resource the
extender manages (``aliyun.com/gpu-mem`` / ``aliyun.com/gpu-count`` in requests or limits of containers
or init containers), POST ``<url>/filter`` (``NodeNames`` when nodeCacheCapable, else the full
``Nodes``), POST ``<url>/prioritize`` (skipped when one node is left, as kube-scheduler does; its errors
are ignored, as kube-scheduler does), the best ``weight`` x score (ties drawn with a seedable RNG), and
POST ``<url>/bind``. A non-200 status or a non-empty ``Error`` fails the attempt: the pod gets a
FailedScheduling Event and is retried with backoff (1 s doubling to 10 s).

What it leaves out: kube-scheduler's own scoring plugins (only the extender scores nodes), taints,
affinity, topology spread and preemption. Pods that request no GPU are bound directly by this loop to a
node that fits their CPU and memory (the least requested one), without the extender, unless
``extender_for_all_pods`` is set: then they go through filter, prioritize and bind as well, as with a
kube-scheduler extender configuration that lists no ``managedResources``.
"""

from __future__ import annotations

import heapq
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
from kubernetes import client

from gpushare.contract import RequestError, host_requests, requests_gpu
from gpushare.kube.api import Kube, KubeError, Obj
from gpushare.kube.convert import pod_info
from gpushare.kube.informer import Informer
from gpushare.quantity import capacity_amount

log = logging.getLogger(__name__)

COMPONENT = "gpushare-local-scheduler"
EXTENDER_TIMEOUT_S = 5.0
MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10
INITIAL_BACKOFF_S = 1.0
MAX_BACKOFF_S = 10.0
SYNC_TIMEOUT_S = 30.0


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
class _HostNode:
    """What the loop's own checks read from a node, plus the raw object for nodeCacheCapable: false."""

    name: str
    cpu_milli: int
    memory_mib: int
    pods: int
    ready: bool
    unschedulable: bool
    raw: Obj


@dataclass(slots=True)
class _Usage:
    cpu_milli: int = 0
    memory_mib: int = 0
    pods: int = 0


def _host_node(obj: Obj) -> _HostNode:
    status = obj.get("status") or {}
    allocatable = status.get("allocatable") or status.get("capacity") or {}
    conditions = status.get("conditions") or []
    ready_conditions = [c for c in conditions if c.get("type") == "Ready"]
    # A node that reports no conditions at all is taken as ready: nothing says otherwise.
    ready = not ready_conditions or ready_conditions[0].get("status") == "True"
    return _HostNode(name=obj["metadata"]["name"], cpu_milli=capacity_amount(allocatable, "cpu"),
                     memory_mib=capacity_amount(allocatable, "memory"),
                     pods=capacity_amount(allocatable, "pods"), ready=ready,
                     unschedulable=bool((obj.get("spec") or {}).get("unschedulable")), raw=obj)


def _holds_resources(obj: Obj) -> bool:
    meta = obj.get("metadata") or {}
    phase = (obj.get("status") or {}).get("phase")
    return meta.get("deletionTimestamp") is None and phase not in ("Succeeded", "Failed")


def _pod_key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


class SchedulerLoop:
    """Schedules the local cluster's pending pods through a gpushare extender over HTTP.

    ``schedule_pod`` and ``schedule_once`` work synchronously without ``start``; ``start`` adds a worker
    that schedules pending pods as they appear, with backoff for those that fail.
    """

    def __init__(self, api_client: client.ApiClient, extender_url: str, weight: int = 1,
                 node_cache_capable: bool = True, seed: int | None = None, extender_for_all_pods: bool = False) -> None:
        self._kube = Kube.from_api_client(api_client)
        self._url = extender_url.rstrip("/")
        self.weight = weight
        self.node_cache_capable = node_cache_capable
        self.extender_for_all_pods = extender_for_all_pods
        self._rng = random.Random(seed)
        self._http = httpx.Client(timeout=EXTENDER_TIMEOUT_S, headers={"Content-Type": "application/json"})
        self._lock = threading.Lock()
        self._nodes: dict[str, _HostNode] = {}
        self._bound: dict[str, tuple[str, int, int]] = {}
        self._usage: dict[str, _Usage] = {}
        self._pending: dict[str, Obj] = {}
        self._backoff: dict[str, float] = {}
        self._queue: list[tuple[float, str]] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._schedule_lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self._node_informer = Informer(self._kube.nodes.list_call, on_sync=self._sync_nodes,
                                       on_event=self._node_event, kind="nodes")
        self._pod_informer = Informer(self._kube.pods.list_call, on_sync=self._sync_pods,
                                      on_event=self._pod_event, kind="pods")
        self._watching = False

    # -- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> None:
        """Watch the cluster and schedule pending pods in the background until ``stop``."""
        self._ensure_watching()
        self._stop.clear()
        self._worker = threading.Thread(target=self._run, name="scheduler-loop", daemon=True)
        self._worker.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._worker is not None:
            self._worker.join(timeout=10)
            self._worker = None
        if self._watching:
            self._pod_informer.stop()
            self._node_informer.stop()
            self._watching = False
        self._http.close()

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
        """Try every pending pod once, highest priority and oldest first."""
        self._ensure_watching()
        with self._lock:
            pending = sorted(self._pending.values(), key=_queue_order)
        return [self.schedule_pod(obj["metadata"]["name"], obj["metadata"].get("namespace") or "default")
                for obj in pending]

    def schedule_pod(self, name: str, namespace: str = "default") -> ScheduleResult:
        """Schedule one pod now; on failure record a FailedScheduling Event and return the message."""
        self._ensure_watching()
        key = f"{namespace}/{name}"
        with self._schedule_lock:
            try:
                obj = self._kube.pods.read(namespace, name)
            except KubeError as exc:
                return ScheduleResult(key, None, str(exc))
            bound = (obj.get("spec") or {}).get("nodeName")
            if bound:
                return ScheduleResult(key, bound, f"pod {key} is already bound to node {bound}")
            if not _holds_resources(obj):
                return ScheduleResult(key, None, f"pod {key} is terminating or has finished")
            node, message = self._decide_and_bind(obj)
            if node is None:
                self._kube.pods.record_event(namespace, name, str(obj["metadata"].get("uid") or ""),
                                             reason="FailedScheduling", message=message, component=COMPONENT)
                log.info("pod not scheduled", extra={"pod": key, "reason": message})
                return ScheduleResult(key, None, message)
            self._kube.pods.record_event(namespace, name, str(obj["metadata"].get("uid") or ""), reason="Scheduled",
                                         message=message, component=COMPONENT, event_type="Normal")
            return ScheduleResult(key, node, message)

    def _decide_and_bind(self, obj: Obj) -> tuple[str | None, str]:
        pod = pod_info(obj)
        try:
            cpu, memory = host_requests(pod)
            wants_gpu = requests_gpu(pod)
        except RequestError as exc:
            return None, str(exc)
        feasible, reasons = self._host_feasible(cpu, memory)
        total = len(self._nodes)
        if not feasible:
            return None, _unavailable(total, reasons)
        if not wants_gpu and not self.extender_for_all_pods:
            with self._lock:
                best = min(feasible, key=lambda n: (self._usage.get(n.name, _Usage()).cpu_milli / max(n.cpu_milli, 1),
                                                    n.name))
            return self._bind_directly(obj, best.name, cpu, memory)
        names, failed, error = self._filter(obj, feasible)
        if error:
            return None, error
        reasons.update(failed)
        if not names:
            return None, _unavailable(total, reasons)
        scores = self._prioritize(obj, feasible, names) if len(names) > 1 else {}
        top = max(scores.get(n, 0) for n in names)
        best_name = self._rng.choice([n for n in names if scores.get(n, 0) == top])
        return self._bind_with_extender(obj, best_name, cpu, memory)

    def _host_feasible(self, cpu: int, memory: int) -> tuple[list[_HostNode], Counter[str]]:
        """kube-scheduler's own checks: node Ready and schedulable, requests within allocatable."""
        feasible = []
        reasons: Counter[str] = Counter()
        with self._lock:
            for node in self._nodes.values():
                used = self._usage.get(node.name, _Usage())
                if not node.ready:
                    reasons["node(s) were not ready"] += 1
                elif node.unschedulable:
                    reasons["node(s) were unschedulable"] += 1
                elif node.pods and used.pods + 1 > node.pods:
                    reasons["Too many pods"] += 1
                elif cpu and used.cpu_milli + cpu > node.cpu_milli:
                    reasons["Insufficient cpu"] += 1
                elif memory and used.memory_mib + memory > node.memory_mib:
                    reasons["Insufficient memory"] += 1
                else:
                    feasible.append(node)
        return feasible, reasons

    def _call(self, verb: str, payload: Any) -> tuple[Any, str]:
        """POST a verb; the decoded answer, or an error sentence as kube-scheduler would report it."""
        try:
            response = self._http.post(f"{self._url}/{verb}", content=orjson.dumps(payload))
        except httpx.HTTPError as exc:
            return None, f"the extender's {verb} call failed: {exc}"
        if response.status_code != 200:
            return None, f"the extender's {verb} call answered HTTP {response.status_code}: {response.text.strip()}"
        try:
            return orjson.loads(response.content), ""
        except orjson.JSONDecodeError:
            return None, f"the extender's {verb} answer is not JSON"

    def _args(self, obj: Obj, nodes: Iterable[_HostNode]) -> dict[str, Any]:
        if self.node_cache_capable:
            return {"Pod": obj, "Nodes": None, "NodeNames": [n.name for n in nodes]}
        return {"Pod": obj, "Nodes": {"metadata": {}, "items": [n.raw for n in nodes]}, "NodeNames": None}

    def _filter(self, obj: Obj, nodes: list[_HostNode]) -> tuple[list[str], dict[str, int], str]:
        answer, error = self._call("filter", self._args(obj, nodes))
        if error:
            return [], {}, error
        if not isinstance(answer, dict):
            return [], {}, "the extender's filter answer is not an ExtenderFilterResult"
        if answer.get("Error"):
            return [], {}, str(answer["Error"])
        sent = {n.name for n in nodes}
        if self.node_cache_capable:
            names = answer.get("NodeNames") or []
        else:
            names = [i["metadata"]["name"] for i in (answer.get("Nodes") or {}).get("items") or []]
        failed: Counter[str] = Counter()
        for group in ("FailedNodes", "FailedAndUnresolvableNodes"):
            for message in (answer.get(group) or {}).values():
                failed[str(message)] += 1
        return [n for n in names if n in sent], dict(failed), ""

    def _prioritize(self, obj: Obj, nodes: list[_HostNode], names: list[str]) -> dict[str, int]:
        keep = set(names)
        answer, error = self._call("prioritize", self._args(obj, [n for n in nodes if n.name in keep]))
        if error or not isinstance(answer, list):
            log.warning("ignoring the extender's prioritize failure, as kube-scheduler does: %s", error)
            return {}
        scale = MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY
        return {str(h["Host"]): int(h["Score"]) * self.weight * scale for h in answer
                if isinstance(h, dict) and h.get("Host") in keep}

    def _bind_with_extender(self, obj: Obj, node: str, cpu: int, memory: int) -> tuple[str | None, str]:
        meta = obj["metadata"]
        answer, error = self._call("bind", {"PodName": meta["name"], "PodNamespace": meta.get("namespace") or "default",
                                            "PodUID": meta.get("uid") or "", "Node": node})
        if error:
            return None, error
        if isinstance(answer, dict) and answer.get("Error"):
            return None, str(answer["Error"])
        self._assume(_pod_key(obj), node, cpu, memory)
        return node, f"Successfully assigned {_pod_key(obj)} to {node}"

    def _bind_directly(self, obj: Obj, node: str, cpu: int, memory: int) -> tuple[str | None, str]:
        meta = obj["metadata"]
        try:
            self._kube.pods.bind(meta.get("namespace") or "default", meta["name"], str(meta.get("uid") or ""), node)
        except KubeError as exc:
            return None, str(exc)
        self._assume(_pod_key(obj), node, cpu, memory)
        return node, f"Successfully assigned {_pod_key(obj)} to {node}"

    # -- the loop's view of the cluster --------------------------------------------------------------------

    def _assume(self, key: str, node: str, cpu: int, memory: int) -> None:
        """Count a pod on its node at once, as kube-scheduler's assume cache does, before the watch shows it."""
        with self._lock:
            self._account(key, (node, cpu, memory))
            self._pending.pop(key, None)
            self._backoff.pop(key, None)

    def _account(self, key: str, entry: tuple[str, int, int] | None) -> None:
        old = self._bound.pop(key, None)
        if old is not None:
            usage = self._usage[old[0]]
            usage.cpu_milli -= old[1]
            usage.memory_mib -= old[2]
            usage.pods -= 1
        if entry is not None:
            self._bound[key] = entry
            usage = self._usage.setdefault(entry[0], _Usage())
            usage.cpu_milli += entry[1]
            usage.memory_mib += entry[2]
            usage.pods += 1

    def _sync_nodes(self, items: list[Obj]) -> None:
        with self._lock:
            self._nodes = {n.name: n for n in map(_host_node, items)}

    def _node_event(self, kind: str, obj: Obj) -> None:
        with self._lock:
            if kind == "DELETED":
                self._nodes.pop(obj["metadata"]["name"], None)
            else:
                node = _host_node(obj)
                self._nodes[node.name] = node
        self._wake.set()

    def _sync_pods(self, items: list[Obj]) -> None:
        with self._lock:
            for key in list(self._bound):
                self._account(key, None)
            self._pending.clear()
            for obj in items:
                self._track(obj)
        self._wake.set()

    def _pod_event(self, kind: str, obj: Obj) -> None:
        with self._lock:
            if kind == "DELETED":
                key = _pod_key(obj)
                self._account(key, None)
                self._pending.pop(key, None)
                self._backoff.pop(key, None)
            else:
                self._track(obj)
        self._wake.set()

    def _track(self, obj: Obj) -> None:
        key = _pod_key(obj)
        node = (obj.get("spec") or {}).get("nodeName")
        if not _holds_resources(obj):
            self._account(key, None)
            self._pending.pop(key, None)
        elif node:
            try:
                cpu, memory = host_requests(pod_info(obj))
            except RequestError:
                cpu = memory = 0
            self._account(key, (node, cpu, memory))
            self._pending.pop(key, None)
        else:
            if key not in self._pending and key not in self._backoff:
                heapq.heappush(self._queue, (0.0, key))
            self._pending[key] = obj

    # -- background worker ---------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            key = self._next_ready()
            if key is None:
                continue
            namespace, _, name = key.partition("/")
            try:
                result = self.schedule_pod(name, namespace)
            except Exception:  # the loop must survive anything one pod does
                log.exception("scheduling a pod failed unexpectedly", extra={"pod": key})
                result = ScheduleResult(key, None, "unexpected error")
            if not result.scheduled:
                self._retry_later(key)

    def _next_ready(self) -> str | None:
        """The next pod whose backoff has passed, waiting at most until then (or a watch event)."""
        with self._lock:
            while self._queue:
                ready_at, key = self._queue[0]
                if key not in self._pending:
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

    def _retry_later(self, key: str) -> None:
        with self._lock:
            if key not in self._pending:
                return
            backoff = min(self._backoff.get(key, INITIAL_BACKOFF_S / 2) * 2, MAX_BACKOFF_S)
            self._backoff[key] = backoff
            heapq.heappush(self._queue, (time.monotonic() + backoff, key))


def _queue_order(obj: Obj) -> tuple[int, str, str]:
    spec = obj.get("spec") or {}
    meta = obj.get("metadata") or {}
    return (-int(spec.get("priority") or 0), str(meta.get("creationTimestamp") or ""), _pod_key(obj))


def _unavailable(total: int, reasons: Counter[str] | dict[str, int]) -> str:
    """kube-scheduler's summary: '0/N nodes are available: 2 Insufficient cpu, 1 <extender message>.'"""
    parts = [f"{count} {reason}" for reason, count in sorted(reasons.items(), key=lambda r: (-r[1], r[0]))]
    return f"0/{total} nodes are available: {', '.join(parts) or 'no nodes'}."
