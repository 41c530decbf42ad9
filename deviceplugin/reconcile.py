"""Makes pod annotations agree with the GPUs their containers really got, as the kubelet reports them.

Allocate cannot know which pod the kubelet is starting, so two pods of the same size can trade places
(Aliyun's users saw this). The kubelet's PodResources API lists each container's device IDs; this plugin
knows which GPUs each device set was given (or, after a restart, reads it off the IDs, which carry the GPU's
UUID). Where a pod's annotations name other GPUs, they are rewritten and the change logged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import grpc
from prometheus_client import Counter

from deviceplugin.allocator import moved_to
from deviceplugin.devices import gpus_of
from deviceplugin.inventory import Inventory
from deviceplugin.matching import placement_from_devices
from deviceplugin.podcache import PodCache
from gpushare.contract import RESOURCE_GPU_MEM, Assignment, PodInfo, read_assignment
from gpushare.kube.api import Conflict, NotFound, Pods
from gpushare.kubeletapi import podresources_v1_pb2 as podresources
from gpushare.kubeletapi import podresources_v1_pb2_grpc as podresources_rpc

log = logging.getLogger(__name__)

LIST_TIMEOUT_S = 10.0


class Reconciler:
    def __init__(self, socket_path: Path, cache: PodCache, pods: Pods, inventory: Inventory,
                 handed_out: Callable[[frozenset[str]], tuple[int, ...] | None], interval_s: float,
                 corrections: Counter) -> None:
        self._socket = socket_path
        self._cache = cache
        self._pods = pods
        self._inventory = inventory
        self._handed_out = handed_out
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._channel: grpc.Channel | None = None
        self._warned = False
        self._corrections = corrections

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="reconciler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=LIST_TIMEOUT_S + 1)
        if self._channel is not None:
            self._channel.close()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.reconcile()
            except grpc.RpcError as exc:
                if not self._warned:
                    log.warning("Cannot read the kubelet's PodResources API at %s (%s); pod annotations are not "
                                "checked against real allocations until it answers. Mount the pod-resources "
                                "folder into the plugin or set --pod-resources-socket.", self._socket,
                                exc.code() if hasattr(exc, "code") else exc)
                    self._warned = True

    def reconcile(self) -> int:
        """One pass; return how many pods were corrected."""
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"unix://{self._socket}")
        stub = podresources_rpc.PodResourcesListerStub(self._channel)
        response: podresources.ListPodResourcesResponse = stub.List(podresources.ListPodResourcesRequest(),
                                                                   timeout=LIST_TIMEOUT_S)
        self._warned = False
        corrected = 0
        for pod in response.pod_resources:
            info = self._cache.get(f"{pod.namespace}/{pod.name}")
            assignment = read_assignment(info) if info is not None else None
            if info is None or assignment is None or not assignment.assigned:
                continue
            truth = self._real_gpus(pod, len(assignment.gpu_indices))
            if truth is not None and set(truth) != set(assignment.gpu_indices) and self._correct(
                    info, assignment, truth):
                corrected += 1
        self._corrections.inc(corrected)
        return corrected

    def _real_gpus(self, pod: podresources.PodResources, gpu_count: int) -> tuple[int, ...] | None:
        """The GPUs the pod's GPU containers got, when they all agree."""
        found: set[tuple[int, ...]] = set()
        for container in pod.containers:
            ids = [i for d in container.devices if d.resource_name == RESOURCE_GPU_MEM for i in d.device_ids]
            if not ids:
                continue
            gpus = self._handed_out(frozenset(ids))
            if gpus is None:
                try:
                    gpus = placement_from_devices(gpus_of(ids, self._inventory.index_by_uuid), gpu_count)
                except ValueError:
                    continue
            if gpus is not None:
                found.add(tuple(sorted(gpus)))
        if len(found) > 1:
            log.warning("The containers of pod %s/%s got devices of different GPUs (%s); leaving its annotations "
                        "as they are.", pod.namespace, pod.name, sorted(found),
                        extra={"pod": f"{pod.namespace}/{pod.name}"})
            return None
        return found.pop() if found else None

    def _correct(self, pod: PodInfo, assignment: Assignment, truth: tuple[int, ...]) -> bool:
        recorded = assignment.gpu_indices
        try:
            updated = self._pods.annotate(pod.namespace, pod.name, pod.resource_version,
                                          moved_to(assignment, self._inventory, truth).annotations())
        except (Conflict, NotFound):
            return False  # the next pass sees the pod as it is now
        self._cache.apply(updated)
        log.warning("Pod %s runs on GPU(s) %s according to the kubelet, but its annotations said %s; corrected "
                    "them.", pod.key, _names(truth), _names(recorded),
                    extra={"pod": pod.key, "gpus": list(truth), "recorded": list(recorded)})
        return True


def _names(gpus: tuple[int, ...]) -> str:
    return ",".join(str(i) for i in gpus)
