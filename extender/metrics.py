"""Prometheus metrics of the extender: requests and latency per verb, bind outcomes, GPUs and memory per model."""

from __future__ import annotations

import threading
import time
from collections import Counter as Tally
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, GCCollector, Histogram, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from extender.tls import ServerTLS
from gpushare.cache.state import ClusterCache
from gpushare.model import Node

# A pod's wait from its first filter to its bind: a cycle when it fits at once, minutes when it backs off.
WAIT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# Pods whose first filter is remembered; beyond it the oldest are forgotten (and their wait goes unmeasured).
WAITING_PODS = 100_000
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _ClusterCollector(Collector):
    """Reads the cache at scrape time, so serving requests never pays for the gauges.

    Per GPU model, never per GPU: at 15,000 nodes, two series per GPU were 240,000 series and 21 MB per scrape,
    and rendering them held the interpreter for 1.6 s, a stall of every filter and bind in flight at each
    scrape. Each node's device plugin exports its own GPUs' series (``docs/device-plugin.md``).
    """

    def __init__(self, cache: ClusterCache, is_leader: Callable[[], bool]) -> None:
        self._cache = cache
        self._is_leader = is_leader

    def collect(self) -> Iterator[GaugeMetricFamily]:
        # Summed per node state, each state's totals remembered by the cache as a policy's scores are: thousands of
        # nodes share a few hundred states. (A state fixes every field read here but the unit, and no GPU's memory
        # is the same number in MiB as another's in GiB.) Node by node, a scrape held the interpreter for 35 ms at
        # 5,000 nodes and 99 ms at 15,000, a stall of every filter and bind in flight.
        evaluated = self._cache.evaluate_states(self._cache.node_names(), _TOTALS_KEY, _gpu_totals)
        states, totals = evaluated if evaluated is not None else ([], {})  # None only with a max_reads
        per_model: dict[str, list[int]] = {}  # model -> [GPUs, idle GPUs, MiB, MiB allocated]
        nodes = 0
        for state, count in Tally(states).items():
            node_totals = totals[state]
            if node_totals is None:
                continue
            nodes += count
            for model, sums in node_totals.items():
                counts = per_model.setdefault(model, [0, 0, 0, 0])
                for i, value in enumerate(sums):
                    counts[i] += value * count
        help_texts = ("Healthy GPUs in the extender's cache.",
                      "Healthy GPUs with nothing allocated on them: what whole-GPU and multi-GPU pods need.",
                      "Memory of the healthy GPUs, in MiB.",
                      "GPU memory allocated to pods (bound or being bound) on the healthy GPUs, in MiB.")
        names = ("gpushare_cluster_gpus", "gpushare_cluster_idle_gpus", "gpushare_cluster_gpu_memory_mib",
                 "gpushare_cluster_gpu_memory_allocated_mib")
        for i, (name, help_text) in enumerate(zip(names, help_texts, strict=True)):
            family = GaugeMetricFamily(name, help_text, labels=["model"])
            for model, counts in sorted(per_model.items()):
                family.add_metric([model], counts[i])
            yield family
        yield GaugeMetricFamily("gpushare_extender_nodes", "Nodes in the extender's cache.", value=nodes)
        yield GaugeMetricFamily("gpushare_extender_reservations",
                                "Pods holding GPUs that the watch has not shown bound yet: binds in flight, filter's "
                                "holds and gang plans.",
                                value=self._cache.reservations())
        yield GaugeMetricFamily("gpushare_extender_leader",
                                "1 on the replica that binds (the Lease holder, or the only replica without "
                                "--leader-elect), else 0.", value=1 if self._is_leader() else 0)


class _TLSCollector(Collector):
    """The TLS listener's refused handshakes, from the event loop's tally, and when its certificates expire."""

    def __init__(self, tls: ServerTLS) -> None:
        self._tls = tls

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        refused = CounterMetricFamily("gpushare_extender_tls_refused_handshakes",
                                      "TLS handshakes the extender's listener refused, by reason.", labels=["reason"])
        for refusal, count in self._tls.refusals.counts.items():
            refused.add_metric([refusal.value], count)
        yield refused
        # An expired certificate on either side fails every filter and bind; nothing else says it is coming.
        expiration = GaugeMetricFamily(
            "gpushare_extender_tls_certificate_expiration_timestamp_seconds",
            "When the listener's serving certificate (the first of its chain to expire), its client CA bundle (its "
            "first CA to expire) and the client certificates it admitted in the last hour (client: the first to "
            "expire, kube-scheduler's) stop being valid, in Unix seconds; the files as they are now on disk.",
            labels=["certificate"])
        for name, when in self._tls.expiration().items():
            expiration.add_metric([name], when.timestamp())
        yield expiration


_TOTALS_KEY = "metrics: GPU totals per model"


def _gpu_totals(node: Node) -> dict[str, tuple[int, int, int, int]]:
    """Per model of the node's healthy GPUs: how many, how many have nothing allocated, their memory and what is
    allocated, in MiB (nodes count in their own units)."""
    mib = node.unit.mib
    totals: dict[str, tuple[int, int, int, int]] = {}
    for g in node.gpus:
        if g.healthy:
            gpus, idle, memory, allocated = totals.get(g.model, (0, 0, 0, 0))
            totals[g.model] = (gpus + 1, idle + int(g.used == 0 and g.holders == 0), memory + g.total * mib,
                               allocated + g.used * mib)
    return totals


class ExtenderMetrics:
    """One registry per app, so several extenders can live in one process (tests, benchmarks)."""

    def __init__(self, cache: ClusterCache, is_leader: Callable[[], bool], registry: CollectorRegistry,
                 tls: ServerTLS | None = None) -> None:
        self.registry = registry
        self.requests = Counter("gpushare_extender_requests", "Extender requests by verb and HTTP status.",
                                ["verb", "code"], registry=self.registry)
        self.latency = Histogram("gpushare_extender_request_duration_seconds",
                                 "Time to answer an extender request, by verb.", ["verb"],
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.binds = Counter("gpushare_extender_binds", "Bind outcomes: bound or failed.", ["result"],
                             registry=self.registry)
        for result in ("bound", "failed"):  # from the start, so a rate over them is 0 rather than nothing
            self.binds.labels(result)
        self.bind_conflicts = Counter("gpushare_extender_bind_conflicts",
                                      "Binds that found the pod changed since it was read and decided again.",
                                      registry=self.registry)
        self.lapsed_holds = Counter("gpushare_extender_filter_holds_lapsed",
                                    "GPUs that filter held for a pod and gave back because no bind came within "
                                    "their time (a slow PreBind, or a pod kube-scheduler gave up after filter).",
                                    registry=self.registry)
        self.scheduling_wait = Histogram(
            "gpushare_extender_pod_scheduling_wait_seconds",
            "Time from a pod's first filter to its successful bind on this replica: the GPU path's cost to the pod, "
            "backoffs included.", buckets=WAIT_BUCKETS, registry=self.registry)
        self._first_filter: OrderedDict[str, float] = OrderedDict()
        self._waiting_lock = threading.Lock()
        self.registry.register(_ClusterCollector(cache, is_leader))
        if tls is not None:
            self.registry.register(_TLSCollector(tls))
        # What every Python exporter shows on the default registry: the process's CPU, memory and open files, and
        # the garbage collector's runs per generation (a full collection pauses every request in flight).
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)

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
