"""A simulated kubelet for one node: the device-manager half of a real one, for tests and the demo.

It does what the kubelet does for device plugins, over the same gRPC API and real unix sockets:

* serves ``v1beta1.Registration`` on ``<folder>/kubelet.sock``; on Register it dials the plugin's socket,
  follows ListAndWatch and writes the resource's capacity (all devices) and allocatable (healthy devices)
  into the node's status;
* watches the pods bound to its node and admits new ones in creation order: per container that asks for a
  plugin's resource it picks devices (the plugin's GetPreferredAllocation when offered, else the first free
  ones), calls Allocate once per container and records the env; then it marks the pod Running. A failed
  Allocate fails the pod with ``UnexpectedAdmissionError``, as the kubelet does;
* serves ``v1.PodResourcesLister`` (List, GetAllocatableResources) with the devices each container got;
* ``restart()`` behaves like a kubelet restart: the folder's sockets are deleted, ``kubelet.sock`` is
  recreated and every plugin is forgotten until it registers again (allocations survive, as the kubelet's
  checkpoint does).

Unlike a real kubelet, a pod asking for ``aliyun.com/gpu-mem`` before its plugin registered waits for the
plugin rather than failing, so that tests and the demo need not order their startup.

Run it next to ``gpushare-local-cluster``:
``python -m gpushare.localcluster.kubelet --kubeconfig K --node-name N --dir D``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import signal
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from kubernetes import client

from gpushare.contract import RESOURCE_GPU_MEM
from gpushare.kube.api import MERGE_PATCH, Obj, Pods
from gpushare.kube.client import load_configuration
from gpushare.kube.informer import Informer
from gpushare.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from gpushare.kubeletapi import deviceplugin_v1beta1_pb2_grpc as rpc
from gpushare.kubeletapi import podresources_v1_pb2 as podresources
from gpushare.kubeletapi import podresources_v1_pb2_grpc as podresources_rpc
from gpushare.logs import configure_logging
from gpushare.quantity import QuantityError, to_int

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY = "Healthy"
CALL_TIMEOUT_S = 10.0


@dataclass
class _Plugin:
    resource: str
    preferred: bool
    channel: grpc.Channel
    devices: dict[str, str] = field(default_factory=dict)


@dataclass
class _Admitted:
    namespace: str
    name: str
    devices: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    """container -> resource -> device IDs"""
    live: bool = True


def _key(obj: Obj) -> str:
    meta = obj.get("metadata", {})
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


def _limits(container: Obj) -> dict[str, int]:
    resources = container.get("resources") or {}
    values = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
    result = {}
    for name, value in values.items():
        with contextlib.suppress(QuantityError):
            result[str(name)] = to_int(value)
    return result


class SimulatedKubelet:
    """``SimulatedKubelet(api_client, node_name, directory)``; ``start()``, ``stop()``, ``restart()``.

    ``allocations`` maps ``namespace/name`` -> container -> the env Allocate returned; ``failures`` maps pods
    the kubelet could not admit to the reason it wrote into their status.
    """

    def __init__(self, api_client: client.ApiClient, node_name: str, directory: str | Path,
                 pod_resources_socket: str | Path | None = None) -> None:
        self.node_name = node_name
        self.directory = Path(directory)
        self.pod_resources_socket = Path(pod_resources_socket or self.directory / "pod-resources.sock")
        self._core: Any = client.CoreV1Api(api_client)
        self._changed = threading.Condition()
        self._plugins: dict[str, _Plugin] = {}
        self._admitted: dict[str, _Admitted] = {}
        self._queue: dict[str, Obj] = {}
        self._gate = threading.Event()
        self._gate.set()
        self._stop = threading.Event()
        self.allocations: dict[str, dict[str, dict[str, str]]] = {}
        self.mounts: dict[str, dict[str, list[tuple[str, str, bool]]]] = {}
        self.failures: dict[str, str] = {}
        self.registrations = 0
        self._registration: grpc.Server | None = None
        self._pod_resources: grpc.Server | None = None
        self._informer = Informer(Pods(api_client).list_call, on_sync=self._on_sync,
                                  on_event=self._on_event, kind="pods", field_selector=f"spec.nodeName={node_name}")
        self._worker = threading.Thread(target=self._admit_loop, name=f"kubelet-{node_name}", daemon=True)

    @property
    def socket_path(self) -> Path:
        return self.directory / KUBELET_SOCKET

    # Lifecycle

    def start(self) -> SimulatedKubelet:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._start_registration()
        self._pod_resources = self._serve(self.pod_resources_socket, lambda server: (
            podresources_rpc.add_PodResourcesListerServicer_to_server(_PodResourcesService(self), server)))
        self._informer.start()
        self._worker.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        self._informer.stop()
        self._worker.join(timeout=10)
        self._forget_plugins()
        for server in (self._registration, self._pod_resources):
            if server is not None:
                server.stop(grace=0).wait()

    def __enter__(self) -> SimulatedKubelet:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def restart(self) -> None:
        """Like a kubelet restart: wipe the folder's sockets, forget the plugins, serve kubelet.sock anew."""
        if self._registration is not None:
            self._registration.stop(grace=0).wait()
        self._forget_plugins()
        for path in self.directory.glob("*.sock"):
            if path != self.pod_resources_socket:
                path.unlink(missing_ok=True)
        self._start_registration()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold admissions, as a busy kubelet would: pods bound meanwhile are admitted together afterwards,
        oldest creation first."""
        self._gate.clear()
        try:
            yield
        finally:
            self._gate.set()
            with self._changed:
                self._changed.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
        """Wait until ``predicate()`` holds (checked whenever the kubelet's state changes)."""
        with self._changed:
            return self._changed.wait_for(predicate, timeout=timeout_s)

    def devices(self, resource: str) -> dict[str, str]:
        """The devices a plugin advertises, with their health."""
        with self._changed:
            plugin = self._plugins.get(resource)
            return dict(plugin.devices) if plugin else {}

    def registered(self, resource: str) -> bool:
        with self._changed:
            return resource in self._plugins

    def _serve(self, path: Path, add: Callable[[grpc.Server], object]) -> grpc.Server:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kubelet"))
        add(server)
        server.add_insecure_port(f"unix://{path}")
        server.start()
        return server

    def _start_registration(self) -> None:
        self._registration = self._serve(self.socket_path, lambda server: (
            rpc.add_RegistrationServicer_to_server(_RegistrationService(self), server)))

    def _forget_plugins(self) -> None:
        with self._changed:
            plugins, self._plugins = list(self._plugins.values()), {}
            self._changed.notify_all()
        for plugin in plugins:
            plugin.channel.close()

    # Device plugins

    def register(self, request: pb.RegisterRequest) -> None:
        if request.version != API_VERSION:
            raise ValueError(f"this kubelet speaks device plugin API {API_VERSION}, not {request.version!r}")
        endpoint = self.directory / request.endpoint
        if not request.endpoint or "/" in request.endpoint or not endpoint.exists():
            raise ValueError(f"endpoint {request.endpoint!r} is not a socket in {self.directory}")
        plugin = _Plugin(request.resource_name, request.options.get_preferred_allocation_available,
                         grpc.insecure_channel(f"unix://{endpoint}"))
        with self._changed:
            old = self._plugins.get(plugin.resource)
            self._plugins[plugin.resource] = plugin
            self.registrations += 1
        if old is not None:
            old.channel.close()
        threading.Thread(target=self._follow, args=(plugin,), name=f"listandwatch-{plugin.resource}",
                         daemon=True).start()
        log.info("plugin registered", extra={"node": self.node_name, "resource": plugin.resource})

    def _follow(self, plugin: _Plugin) -> None:
        stub = rpc.DevicePluginStub(plugin.channel)
        try:
            for response in stub.ListAndWatch(pb.Empty()):
                with self._changed:
                    if self._plugins.get(plugin.resource) is not plugin:
                        return
                    plugin.devices = {d.ID: d.health for d in response.devices}
                    capacity = len(plugin.devices)
                    allocatable = sum(1 for h in plugin.devices.values() if h == HEALTHY)
                self._patch_node_status(plugin.resource, capacity, allocatable)
                with self._changed:
                    self._changed.notify_all()
        except grpc.RpcError as exc:
            if not self._stop.is_set() and self._plugins.get(plugin.resource) is plugin:
                log.warning("ListAndWatch of %s ended: %s", plugin.resource, exc.code() if hasattr(exc, "code")
                            else exc, extra={"node": self.node_name, "resource": plugin.resource})

    def _patch_node_status(self, resource: str, capacity: int, allocatable: int) -> None:
        body = {"status": {"capacity": {resource: str(capacity)}, "allocatable": {resource: str(allocatable)}}}
        _ = self._core.patch_node_status(self.node_name, body, _content_type=MERGE_PATCH,
                                         _preload_content=False).data

    # Pods

    def _on_sync(self, items: list[Obj]) -> None:
        with self._changed:
            live = {_key(o) for o in items}
            for key, admitted in self._admitted.items():
                admitted.live = admitted.live and key in live
            for obj in items:
                self._offer(obj)
            self._changed.notify_all()

    def _on_event(self, kind: str, obj: Obj) -> None:
        with self._changed:
            key = _key(obj)
            if kind == "DELETED" or obj.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                self._queue.pop(key, None)
                if key in self._admitted:
                    self._admitted[key].live = False
            else:
                self._offer(obj)
            self._changed.notify_all()

    def _offer(self, obj: Obj) -> None:
        key = _key(obj)
        meta = obj.get("metadata", {})
        pending = obj.get("status", {}).get("phase", "Pending") == "Pending" and not meta.get("deletionTimestamp")
        admitted = self._admitted.get(key)
        if pending and (admitted is None or not admitted.live) and key not in self.failures:
            self._queue[key] = obj

    def _admit_loop(self) -> None:
        while not self._stop.is_set():
            with self._changed:
                self._changed.wait_for(lambda: self._stop.is_set() or (self._gate.is_set() and bool(
                    self._ready_pods())), timeout=1.0)
                if not self._gate.is_set():
                    continue  # paused: the wait timed out, and nothing may be admitted until the gate opens
                batch = sorted(self._ready_pods(), key=lambda o: (
                    str(o.get("metadata", {}).get("creationTimestamp", "")), _key(o)))
                for obj in batch:
                    key = _key(obj)
                    self._queue.pop(key, None)
                    meta = obj["metadata"]
                    self._admitted[key] = _Admitted(meta.get("namespace") or "default", meta["name"])
            for obj in batch:
                if self._stop.is_set():
                    return
                try:
                    self._admit(obj)
                except Exception:
                    log.exception("admitting pod %s failed", _key(obj), extra={"node": self.node_name})

    def _ready_pods(self) -> list[Obj]:
        """Queued pods, less those that ask for GPU memory before its plugin registered."""
        ready = []
        for obj in self._queue.values():
            containers = obj.get("spec", {}).get("containers") or ()
            wants_gpu = any(_limits(c).get(RESOURCE_GPU_MEM, 0) > 0 for c in containers)
            if not wants_gpu or RESOURCE_GPU_MEM in self._plugins:
                ready.append(obj)
        return ready

    def _admit(self, obj: Obj) -> None:
        key = _key(obj)
        with self._changed:
            admitted = self._admitted[key]
        envs: dict[str, dict[str, str]] = {}
        mounts: dict[str, list[tuple[str, str, bool]]] = {}
        for container in obj.get("spec", {}).get("containers") or ():
            name = str(container.get("name"))
            for resource, count in _limits(container).items():
                with self._changed:
                    plugin = self._plugins.get(resource)
                if plugin is None or count <= 0:
                    continue
                try:
                    devices, response = self._allocate(plugin, count)
                except _AdmissionError as exc:
                    with self._changed:
                        admitted.live = False
                    self._fail(obj, str(exc))
                    return
                with self._changed:
                    admitted.devices.setdefault(name, {})[resource] = devices
                envs.setdefault(name, {}).update(response.envs)
                mounts.setdefault(name, []).extend((m.container_path, m.host_path, m.read_only)
                                                   for m in response.mounts)
        with self._changed:
            self.allocations[key] = envs
            self.mounts[key] = mounts
        self._set_running(obj)
        with self._changed:
            self._changed.notify_all()

    def _allocate(self, plugin: _Plugin, count: int) -> tuple[list[str], pb.ContainerAllocateResponse]:
        with self._changed:
            in_use = {d for a in self._admitted.values() if a.live
                      for per_resource in a.devices.values() for d in per_resource.get(plugin.resource, ())}
            available = [d for d, health in plugin.devices.items() if health == HEALTHY and d not in in_use]
        if len(available) < count:
            raise _AdmissionError(f"Node didn't have enough resource: {plugin.resource}, requested: {count}, "
                                  f"free: {len(available)}")
        stub = rpc.DevicePluginStub(plugin.channel)
        devices = available[:count]
        try:
            if plugin.preferred:
                preferred = stub.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[
                    pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, allocation_size=count)]),
                    timeout=CALL_TIMEOUT_S)
                chosen = list(preferred.container_responses[0].deviceIDs)
                if len(chosen) == count and set(chosen) <= set(available):
                    devices = chosen
            response = stub.Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=devices)]), timeout=CALL_TIMEOUT_S)
        except grpc.RpcError as exc:
            details = exc.details() if hasattr(exc, "details") else str(exc)
            raise _AdmissionError(f"Allocate failed due to {details}, which is unexpected") from None
        result: pb.ContainerAllocateResponse = response.container_responses[0]
        return devices, result

    def _fail(self, obj: Obj, message: str) -> None:
        key = _key(obj)
        with self._changed:
            self.failures[key] = message
            self._changed.notify_all()
        log.warning("pod admission failed", extra={"node": self.node_name, "pod": key, "reason": message})
        self._patch_pod_status(obj, {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": message})

    def _set_running(self, obj: Obj) -> None:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        conditions = [{"type": t, "status": "True", "lastTransitionTime": now}
                      for t in ("Initialized", "ContainersReady", "Ready")]
        self._patch_pod_status(obj, {"phase": "Running", "startTime": now, "conditions": conditions})

    def _patch_pod_status(self, obj: Obj, status: dict[str, Any]) -> None:
        meta = obj["metadata"]
        _ = self._core.patch_namespaced_pod_status(meta["name"], meta.get("namespace") or "default",
                                                   {"status": status}, _content_type=MERGE_PATCH,
                                                   _preload_content=False).data

    def pod_resources(self) -> list[podresources.PodResources]:
        with self._changed:
            admitted = [a for a in self._admitted.values() if a.live and a.devices]
            return [podresources.PodResources(name=a.name, namespace=a.namespace, containers=[
                podresources.ContainerResources(name=container, devices=[
                    podresources.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in per.items()])
                for container, per in a.devices.items()]) for a in admitted]

    def allocatable_devices(self) -> list[podresources.ContainerDevices]:
        with self._changed:
            return [podresources.ContainerDevices(resource_name=p.resource, device_ids=[
                d for d, h in p.devices.items() if h == HEALTHY]) for p in self._plugins.values()]


class _AdmissionError(Exception):
    pass


class _RegistrationService(rpc.RegistrationServicer):
    def __init__(self, kubelet: SimulatedKubelet) -> None:
        self._kubelet = kubelet

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        try:
            self._kubelet.register(request)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"Registration of {request.resource_name} failed: {exc}.")
        return pb.Empty()


class _PodResourcesService(podresources_rpc.PodResourcesListerServicer):
    def __init__(self, kubelet: SimulatedKubelet) -> None:
        self._kubelet = kubelet

    def List(self, request: podresources.ListPodResourcesRequest,
             context: grpc.ServicerContext) -> podresources.ListPodResourcesResponse:
        return podresources.ListPodResourcesResponse(pod_resources=self._kubelet.pod_resources())

    def GetAllocatableResources(self, request: podresources.AllocatableResourcesRequest,
                                context: grpc.ServicerContext) -> podresources.AllocatableResourcesResponse:
        return podresources.AllocatableResourcesResponse(devices=self._kubelet.allocatable_devices())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m gpushare.localcluster.kubelet", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", required=True, help="kubeconfig of the local cluster")
    parser.add_argument("--node-name", required=True)
    parser.add_argument("--dir", type=Path, required=True, help="device plugin folder to serve kubelet.sock in")
    parser.add_argument("--pod-resources-socket", type=Path, help="default: <dir>/pod-resources.sock")
    args = parser.parse_args(argv)
    configure_logging("INFO")
    api_client = client.ApiClient(load_configuration(args.kubeconfig))
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    with SimulatedKubelet(api_client, args.node_name, args.dir, args.pod_resources_socket):
        done.wait()


if __name__ == "__main__":
    main()
