"""Prometheus metrics of the extender: requests and latency per verb, bind outcomes, GPU memory per GPU."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpushare.cache.state import ClusterCache

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

    def __init__(self, cache: ClusterCache, is_leader: Callable[[], bool] = lambda: True) -> None:
        self.registry = CollectorRegistry()
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
        self.registry.register(_ClusterCollector(cache, is_leader))

    @contextmanager
    def timed(self, verb: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.latency.labels(verb).observe(time.perf_counter() - start)

    def count(self, verb: str, code: int) -> None:
        self.requests.labels(verb, str(code)).inc()
