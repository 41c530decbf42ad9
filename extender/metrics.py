"""Prometheus metrics of the extender: requests and latency per verb, bind outcomes, GPU memory per GPU."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpushare.cache.state import ClusterCache

# A pod's wait from its first filter to its bind: a cycle when it fits at once, minutes when it backs off.
WAIT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# Pods whose first filter is remembered; beyond it the oldest are forgotten (and their wait goes unmeasured).
WAITING_PODS = 100_000
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _ClusterCollector(Collector):
    """Reads the cache at scrape time, so serving requests never pays for the gauges."""

    def __init__(self, cache: ClusterCache, is_leader: Callable[[], bool]) -> None:
        self._cache = cache
        self._is_leader = is_leader

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["node", "gpu", "model"]
        total = GaugeMetricFamily("gpushare_gpu_memory_total", "GPU memory in the configured unit.", labels=labels)
        used = GaugeMetricFamily("gpushare_gpu_memory_allocated",
                                 "GPU memory allocated to pods (bound or being bound), in the configured unit.",
                                 labels=labels)
        gpus = self._cache.evaluate(self._cache.node_names(),
                                    lambda node: [(g.index, g.model, g.total, g.used) for g in node.gpus])
        nodes = set()
        for node, rows in gpus.items():
            if rows is None:
                continue
            nodes.add(node)
            for index, model, total_units, used_units in rows:
                total.add_metric([node, str(index), model], total_units)
                used.add_metric([node, str(index), model], used_units)
        yield total
        yield used
        yield GaugeMetricFamily("gpushare_extender_nodes", "Nodes in the extender's cache.", value=len(nodes))
        yield GaugeMetricFamily("gpushare_extender_reservations",
                                "Reservations of binds not yet confirmed by the watch.",
                                value=self._cache.reservations())
        yield GaugeMetricFamily("gpushare_extender_leader",
                                "1 on the replica that binds (the Lease holder, or the only replica without "
                                "--leader-elect), else 0.", value=1 if self._is_leader() else 0)


class ExtenderMetrics:
    """One registry per app, so several extenders can live in one process (tests, benchmarks)."""

    def __init__(self, cache: ClusterCache, is_leader: Callable[[], bool], registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter("gpushare_extender_requests", "Extender requests by verb and HTTP status.",
                                ["verb", "code"], registry=self.registry)
        self.latency = Histogram("gpushare_extender_request_duration_seconds",
                                 "Time to answer an extender request, by verb.", ["verb"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.binds = Counter("gpushare_extender_binds", "Bind outcomes: bound or failed.", ["result"],
                             registry=self.registry)
        self.bind_conflicts = Counter("gpushare_extender_bind_conflicts",
                                      "Binds that found the pod changed since it was read and decided again.",
                                      registry=self.registry)
        self.scheduling_wait = Histogram(
            "gpushare_extender_pod_scheduling_wait_seconds",
            "Time from a pod's first filter to its successful bind on this replica: the GPU path's cost to the pod, "
            "backoffs included.", buckets=WAIT_BUCKETS, registry=self.registry)
        self._first_filter: OrderedDict[str, float] = OrderedDict()
        self._waiting_lock = threading.Lock()
        self.registry.register(_ClusterCollector(cache, is_leader))

    def filtered(self, uid: str) -> None:
        """Remember when a pod was first filtered (kube-scheduler filters it again on every retry)."""
        if not uid:
            return
        with self._waiting_lock:
            if uid not in self._first_filter:
                self._first_filter[uid] = time.monotonic()
                if len(self._first_filter) > WAITING_PODS:
                    self._first_filter.popitem(last=False)

    def bound(self, uid: str) -> None:
        with self._waiting_lock:
            first = self._first_filter.pop(uid, None)
        if first is not None:
            self.scheduling_wait.observe(time.monotonic() - first)

    @contextmanager
    def timed(self, verb: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.latency.labels(verb).observe(time.perf_counter() - start)

    def count(self, verb: str, code: int) -> None:
        self.requests.labels(verb, str(code)).inc()
