"""The plugin's HTTP endpoint: ``/healthz``, ``/readyz`` and Prometheus ``/metrics``.

Per-GPU gauges are computed at scrape time from the inventory and the pod cache, so they are never stale.
"""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from deviceplugin.inventory import Inventory
from gpushare.contract import PodInfo, read_assignment


class PluginMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.allocations = Counter("gpushare_deviceplugin_allocations_total",
                                   "Containers allocated (outcome allocated), and Allocate calls refused "
                                   "(no_pending_pod, invalid, error).", ["outcome"], registry=registry)
        for outcome in ("allocated", "no_pending_pod", "invalid", "error"):  # 0 from the start, for rates
            self.allocations.labels(outcome)
        self.allocate_seconds = Histogram("gpushare_deviceplugin_allocate_seconds",
                                          "Time to serve one Allocate call that succeeded.", registry=registry,
                                          buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5))
        self.xid_events = Counter("gpushare_gpu_xid_events_total", "XID events reported by the GPUs.",
                                  ["gpu", "xid"], registry=registry)
        self.corrections = Counter("gpushare_deviceplugin_reconcile_corrections_total",
                                   "Pods whose GPU annotations were corrected from the kubelet's PodResources.",
                                   registry=registry)


class GPUCollector(Collector):
    def __init__(self, inventory: Inventory, pods: Callable[[], Iterable[PodInfo]]) -> None:
        self._inventory = inventory
        self._pods = pods

    def collect(self) -> Iterator[Metric]:
        labels = ["gpu", "uuid", "model"]
        total = GaugeMetricFamily("gpushare_gpu_memory_total_mib", "GPU memory.", labels=labels)
        allocated = GaugeMetricFamily("gpushare_gpu_memory_allocated_mib",
                                      "GPU memory promised to pods bound to this node.", labels=labels)
        used = GaugeMetricFamily("gpushare_gpu_memory_used_mib", "GPU memory in use, as the driver reports it.",
                                 labels=labels)
        healthy = GaugeMetricFamily("gpushare_gpu_healthy", "1 when the GPU is healthy, 0 after a critical XID.",
                                    labels=labels)
        promised = self._allocated_mib()
        for gpu in self._inventory.gpus:
            values = [str(gpu.index), gpu.uuid, gpu.model]
            total.add_metric(values, gpu.memory_mib)
            allocated.add_metric(values, promised.get(gpu.index, 0))
            healthy.add_metric(values, 1 if self._inventory.healthy(gpu.index) else 0)
            in_use = self._inventory.used_mib(gpu.index)
            if in_use is not None:
                used.add_metric(values, in_use)
        yield from (total, allocated, used, healthy)

    def _allocated_mib(self) -> dict[int, int]:
        unit = self._inventory.unit
        result: dict[int, int] = {}
        for pod in self._pods():
            assignment = read_assignment(pod)
            if assignment is None or not pod.is_active:
                continue
            for index in assignment.gpu_indices:
                if assignment.exclusive:
                    try:
                        share = self._inventory.gpu(index).memory_mib
                    except KeyError:
                        continue
                else:
                    share = assignment.per_gpu * unit.mib
                result[index] = result.get(index, 0) + share
        return result


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would flood the log."""


class StatusServer:
    def __init__(self, registry: CollectorRegistry, healthy: Callable[[], bool], ready: Callable[[], bool],
                 address: str, port: int) -> None:
        metrics_app = make_wsgi_app(registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path in ("/healthz", "/readyz"):
                ok = healthy() if path == "/healthz" else ready()
                start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
                return [b"ok\n" if ok else b"not ready\n"]
            if path == "/metrics":
                result: Iterable[bytes] = metrics_app(environ, start_response)
                return result
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"Use /healthz, /readyz or /metrics.\n"]

        self._server = make_server(address, port, app, server_class=_ThreadingServer, handler_class=_QuietHandler)
        self.port = int(self._server.server_address[1])
        # A short poll keeps stop() quick; serving itself does not poll.
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="status-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
