"""The ``v1beta1.DevicePlugin`` gRPC service the kubelet calls on ``aliyungpushare.sock``."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import grpc

from deviceplugin.allocator import Allocator
from deviceplugin.arguments import AllocationError, InvalidArgument, NotEnoughDevices
from deviceplugin.devices import device_ids
from deviceplugin.inventory import Inventory
from deviceplugin.matching import NoPendingPod
from deviceplugin.metrics import PluginMetrics
from gpushare.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from gpushare.kubeletapi import deviceplugin_v1beta1_pb2_grpc as rpc

log = logging.getLogger(__name__)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
# How often an idle ListAndWatch stream checks whether the kubelet hung up or the plugin is stopping.
STREAM_CHECK_S = 1.0

OPTIONS = pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


def device_list(inventory: Inventory) -> pb.ListAndWatchResponse:
    """Every fake device of every GPU, with the GPU's health and NUMA node."""
    response = pb.ListAndWatchResponse()
    for gpu in inventory.gpus:
        health = HEALTHY if inventory.healthy(gpu.index) else UNHEALTHY
        for device in device_ids(gpu, inventory.unit):
            # add() fills the message in place: about twice as fast as building Device objects first.
            added = response.devices.add(ID=device, health=health)
            if gpu.numa is not None:
                added.topology.nodes.add(ID=gpu.numa)
    return response


class DevicePluginService(rpc.DevicePluginServicer):
    def __init__(self, inventory: Inventory, allocator: Allocator, metrics: PluginMetrics,
                 stopping: threading.Event) -> None:
        self._inventory = inventory
        self._allocator = allocator
        self._metrics = metrics
        self._stopping = stopping
        self._lock = threading.Lock()
        self._cached: tuple[int, pb.ListAndWatchResponse] | None = None

    def _devices(self) -> tuple[int, pb.ListAndWatchResponse]:
        """The current list, built once per health change and shared by every stream."""
        with self._lock:
            version = self._inventory.health_version
            if self._cached is None or self._cached[0] != version:
                self._cached = (version, device_list(self._inventory))
            return self._cached

    def GetDevicePluginOptions(self, request: pb.Empty, context: grpc.ServicerContext) -> pb.DevicePluginOptions:
        return OPTIONS

    def ListAndWatch(self, request: pb.Empty, context: grpc.ServicerContext) -> Iterator[pb.ListAndWatchResponse]:
        seen = -1
        while not self._stopping.is_set() and context.is_active():
            version, response = self._devices()
            if version != seen:
                seen = version
                yield response
            self._inventory.wait(seen, STREAM_CHECK_S, health_only=True)

    def GetPreferredAllocation(self, request: pb.PreferredAllocationRequest,
                               context: grpc.ServicerContext) -> pb.PreferredAllocationResponse:
        containers = request.container_requests
        responses = []
        for number, c in enumerate(containers, start=1):
            try:
                devices = self._allocator.preferred(list(c.available_deviceIDs), list(c.must_include_deviceIDs),
                                                    c.allocation_size, number, len(containers))
            except AllocationError as exc:
                log.warning("GetPreferredAllocation refused: %s", exc,
                            extra={"available": len(c.available_deviceIDs), "size": c.allocation_size})
                context.abort(_status(exc), str(exc))
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=devices))
        return pb.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: pb.AllocateRequest, context: grpc.ServicerContext) -> pb.AllocateResponse:
        started = time.perf_counter()
        containers = [list(c.devices_ids) for c in request.container_requests]
        devices = sum(len(ids) for ids in containers)
        try:
            results = self._allocator.allocate(containers)
        except NoPendingPod as exc:
            self._metrics.allocations.labels("no_pending_pod").inc()
            log.warning("Allocate refused: %s", exc, extra={"containers": len(containers), "devices": devices})
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except AllocationError as exc:
            self._metrics.allocations.labels("invalid" if isinstance(exc, InvalidArgument) else "error").inc()
            log.warning("Allocate refused: %s", exc, extra={"containers": len(containers), "devices": devices})
            context.abort(_status(exc), str(exc))
        self._metrics.allocations.labels("allocated").inc(len(results))
        self._metrics.allocate_seconds.observe(time.perf_counter() - started)
        return pb.AllocateResponse(container_responses=[pb.ContainerAllocateResponse(envs=env, mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in mounts]) for env, mounts in results])

    def PreStartContainer(self, request: pb.PreStartContainerRequest,
                          context: grpc.ServicerContext) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


def _status(exc: AllocationError) -> grpc.StatusCode:
    if isinstance(exc, InvalidArgument):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, NotEnoughDevices):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return grpc.StatusCode.FAILED_PRECONDITION
