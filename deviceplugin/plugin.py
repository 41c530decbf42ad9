"""The device plugin process: wires discovery, the pod cache, the gRPC service and the background loops."""

from __future__ import annotations

import logging
import threading
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from prometheus_client import CollectorRegistry

from deviceplugin.allocator import Allocator
from deviceplugin.gpus import GPUBackend
from deviceplugin.inventory import Inventory
from deviceplugin.isolation import IsolationConfig
from deviceplugin.metrics import GPUCollector, PluginMetrics, StatusServer
from deviceplugin.podcache import PodCache
from deviceplugin.publisher import NodePublisher
from deviceplugin.reconcile import Reconciler
from deviceplugin.registration import Registrar
from deviceplugin.service import OPTIONS, DevicePluginService, device_list
from deviceplugin.usage import find_overuse
from gpushare.contract import RESOURCE_GPU_MEM, MemoryUnit
from gpushare.kube.api import Kube
from gpushare.kubeletapi import deviceplugin_v1beta1_pb2_grpc as rpc

log = logging.getLogger(__name__)

SOCKET_NAME = "aliyungpushare.sock"
DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
# gRPC's default limit on a received message: a kubelet that keeps it cannot take a longer device list.
GRPC_MESSAGE_LIMIT = 4 * 1024 * 1024
HEALTH_TICK_S = 1.0
GRPC_WORKERS = 16


@dataclass(frozen=True)
class PluginConfig:
    node_name: str
    unit: MemoryUnit = MemoryUnit.GiB
    plugin_dir: Path = DEFAULT_PLUGIN_DIR
    pod_resources_socket: Path = DEFAULT_POD_RESOURCES_SOCKET
    isolation: IsolationConfig = field(default_factory=IsolationConfig)
    health_recovery_s: float = 600.0
    reconcile_s: float = 30.0
    usage_s: float = 15.0
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 9445


class DevicePlugin:
    def __init__(self, config: PluginConfig, backend: GPUBackend, kube: Kube) -> None:
        self.config = config
        self._backend = backend
        self.inventory = Inventory(backend.discover(), config.unit, config.health_recovery_s)
        self._stopping = threading.Event()
        self.registry = CollectorRegistry()
        self.metrics = PluginMetrics(self.registry)
        self.cache = PodCache(kube.pods, config.node_name)
        self.allocator = Allocator(self.cache, kube.pods, self.inventory, config.isolation)
        self.registry.register(GPUCollector(self.inventory, self.cache.pods))
        self.publisher = NodePublisher(kube.nodes, config.node_name, self.inventory)
        self._service = DevicePluginService(self.inventory, self.allocator, self.metrics, self._stopping)
        self._server: grpc.Server | None = None
        self._server_lock = threading.Lock()
        self.registrar = Registrar(config.plugin_dir, SOCKET_NAME, RESOURCE_GPU_MEM, OPTIONS, self._restart_server)
        self.reconciler = Reconciler(config.pod_resources_socket, self.cache, kube.pods, self.inventory,
                                     self.allocator.handed_out, config.reconcile_s, self.metrics.corrections)
        self.status = StatusServer(self.registry, healthy=self._healthy, ready=self.ready,
                                   address=config.metrics_address, port=config.metrics_port)
        self._threads: list[threading.Thread] = []
        self._overused: set[tuple[str, str, int]] = set()

    @property
    def socket_path(self) -> Path:
        return self.config.plugin_dir / SOCKET_NAME

    def start(self) -> None:
        self._warn_about_list_size()
        self.cache.start()
        self.publisher.start()
        self._restart_server()
        self.registrar.start()
        self.reconciler.start()
        for target, name in ((self._watch_health, "gpu-health"), (self._watch_usage, "gpu-usage")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        self.status.start()
        log.info("Device plugin for node %s serving %d GPU(s) in %s units on %s.", self.config.node_name,
                 len(self.inventory.gpus), self.config.unit, self.socket_path,
                 extra={"node": self.config.node_name, "gpus": len(self.inventory.gpus)})

    def stop(self) -> None:
        self._stopping.set()
        self.inventory.wake()
        self.registrar.stop()
        self.reconciler.stop()
        with self._server_lock:
            if self._server is not None:
                self._server.stop(grace=1).wait()
                self._server = None
        for thread in self._threads:
            thread.join(timeout=5)
        self.publisher.stop()
        self.cache.stop()
        self.status.stop()
        self._backend.close()

    def ready(self) -> bool:
        return self.registrar.registered.is_set() and self.cache.synced

    def _healthy(self) -> bool:
        return self._server is not None and not self._stopping.is_set()

    def _restart_server(self) -> None:
        """(Re)create the plugin socket: at start, and after the kubelet wiped its folder."""
        with self._server_lock:
            if self._server is not None:
                self._server.stop(grace=1).wait()
            self.config.plugin_dir.mkdir(parents=True, exist_ok=True)
            self.socket_path.unlink(missing_ok=True)
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=GRPC_WORKERS, thread_name_prefix="plugin"))
            rpc.add_DevicePluginServicer_to_server(self._service, server)
            server.add_insecure_port(f"unix://{self.socket_path}")
            server.start()
            self._server = server

    def _warn_about_list_size(self) -> None:
        if self.config.unit is not MemoryUnit.MiB:
            return
        size = device_list(self.inventory).ByteSize()
        over = " which is over gRPC's default 4 MiB message limit," if size > GRPC_MESSAGE_LIMIT else ""
        log.warning("MiB units advertise one device per MiB: every ListAndWatch message here is %.1f MiB,%s and "
                    "the kubelet tracks each device. Use GiB units unless pods need finer shares.",
                    size / 2**20, over, extra={"bytes": size})

    def _watch_health(self) -> None:
        while not self._stopping.is_set():
            wait = self.inventory.seconds_to_recovery()
            try:
                event = self._backend.wait_event(HEALTH_TICK_S if wait is None else min(HEALTH_TICK_S, wait))
            except Exception as exc:  # a driver hiccup must not end health tracking
                log.warning("Waiting for GPU events failed (%s); trying again.", exc)
                self._stopping.wait(HEALTH_TICK_S)
                continue
            if event is not None and not self.inventory.has(event.gpu_index):
                # Never counted: a metric label per made-up GPU would grow without bound.
                log.warning("Ignoring XID %d reported for GPU %d, which this node does not have (it has %d GPU(s)).",
                            event.xid, event.gpu_index, len(self.inventory.gpus),
                            extra={"gpu": event.gpu_index, "xid": event.xid})
            elif event is not None:
                self.metrics.xid_events.labels(str(event.gpu_index), str(event.xid)).inc()
                if not event.critical:
                    log.info("GPU %d reported application XID %d; its health is unchanged.", event.gpu_index,
                             event.xid, extra={"gpu": event.gpu_index, "xid": event.xid})
                elif self.inventory.record(event):
                    log.warning("GPU %d reported XID %d: its devices are Unhealthy until it goes %.0f s without "
                                "another.", event.gpu_index, event.xid, self.config.health_recovery_s,
                                extra={"gpu": event.gpu_index, "xid": event.xid})
            for index in self.inventory.recover():
                log.info("GPU %d has been quiet for %.0f s: its devices are Healthy again.", index,
                         self.config.health_recovery_s, extra={"gpu": index})

    def _watch_usage(self) -> None:
        while not self._stopping.is_set():
            try:
                self.inventory.set_used(self._backend.used_mib())
                self._check_shares()
            except Exception as exc:  # usage is advisory; keep sampling
                log.warning("Reading GPU memory usage failed (%s); trying again in %.0f s.", exc,
                            self.config.usage_s)
            self._stopping.wait(self.config.usage_s)

    def _check_shares(self) -> None:
        names: dict[str, str] = {}
        for pod in self.cache.pods():
            raw = self.cache.raw(pod.key) or {}
            for status in raw.get("status", {}).get("containerStatuses") or ():
                container_id = str(status.get("containerID") or "").rpartition("://")[2]
                if container_id:
                    names[container_id] = str(status.get("name"))
        found = find_overuse(self._backend.process_usage(), self.cache.pods(), self.config.unit, names)
        now = {(o.pod, o.container, o.gpu_index) for o in found}
        for overuse in found:
            if (overuse.pod, overuse.container, overuse.gpu_index) in self._overused:
                continue
            who = f"container {overuse.container} of pod {overuse.pod}" if overuse.container else f"pod {overuse.pod}"
            log.warning("%s uses %d MiB on GPU %d, more than its share of %d MiB; it can starve the GPU's other "
                        "pods. Run the plugin with --isolation hami-core or mps to enforce shares.",
                        who[0].upper() + who[1:], overuse.used_mib, overuse.gpu_index, overuse.share_mib,
                        extra={"pod": overuse.pod, "container": overuse.container, "gpu": overuse.gpu_index,
                               "used_mib": overuse.used_mib, "share_mib": overuse.share_mib})
        self._overused = now
