"""Serves the kubelet's Allocate and GetPreferredAllocation calls: match the pod, record it, build the env.

Every argument is checked first (``deviceplugin.arguments``). One Allocate call is served whole or not at
all: every container of it is matched and its environment built before the pod is written, once, so a call
that fails leaves the pod exactly as it was.

Multi-container pods: the kubelet allocates their GPU containers one call at a time, in spec order. Each
served container is recorded in memory and in the pod annotation ``gpushare.io/allocated-containers`` (so a
restarted plugin carries on); ``ALIYUN_COM_GPU_MEM_ASSIGNED`` turns ``true`` with the last one. Every write
carries the pod's resourceVersion; on a conflict the pod is read again and matched again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import replace

from deviceplugin.arguments import AllocationError, check_allocate, check_preferred
from deviceplugin.gpus import GPUDevice
from deviceplugin.inventory import Inventory
from deviceplugin.isolation import ContainerGrant, IsolationConfig, Mount, container_environment
from deviceplugin.matching import (
    Match,
    NoPendingPod,
    choose,
    no_pending_message,
    preferred_devices,
    served_containers,
    split_evenly,
    unplaced_pods,
    waiting_pods,
)
from deviceplugin.podcache import PodCache
from gpushare.contract import Assignment
from gpushare.kube.api import Conflict, KubeError, NotFound, Pods

log = logging.getLogger(__name__)

ATTEMPTS = 4
# Device-ID sets remembered with the GPUs they were given; the reconciler looks them up. Bounded because a
# node only ever runs a few hundred containers at once.
HANDED_OUT_MEMORY = 4096

ContainerResult = tuple[dict[str, str], list[Mount]]


class Allocator:
    def __init__(self, cache: PodCache, pods: Pods, inventory: Inventory, isolation: IsolationConfig) -> None:
        self._cache = cache
        self._pods = pods
        self._inventory = inventory
        self._isolation = isolation
        self._lock = threading.Lock()
        self._served: dict[str, frozenset[str]] = {}
        self._decided: dict[str, tuple[int, ...]] = {}
        self._written_at: dict[str, float] = {}
        self._handed: OrderedDict[frozenset[str], tuple[int, ...]] = OrderedDict()

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int, number: int,
                  of: int) -> list[str]:
        """Devices to suggest for container request ``number`` of ``of``: exactly ``size`` of ``available``,
        ``must_include`` among them."""
        gpu_of = check_preferred(available, must_include, size, number, of, self._inventory)
        with self._lock:
            waiting = waiting_pods(self._cache.pods(), self._served, self._decided)
            if not any(w.next_container(size) for w in waiting):
                try:
                    self._cache.refresh()  # the watch may not have shown the extender's bind yet
                except KubeError as exc:  # a suggestion without the newest pods is still a valid one
                    log.warning("Could not list the node's pods for GetPreferredAllocation (%s); suggesting "
                                "devices from the pods already seen.", exc)
                waiting = waiting_pods(self._cache.pods(), self._served, self._decided)
        return preferred_devices(waiting, size, available, must_include, gpu_of)

    def allocate(self, requests: Sequence[Sequence[str]]) -> list[ContainerResult]:
        """The env and mounts for each container request of one Allocate call (the kubelet's device IDs)."""
        gpus = check_allocate(requests, self._inventory)
        with self._lock:
            try:
                return self._allocate(requests, [Counter(g) for g in gpus])
            except KubeError as exc:
                raise AllocationError(f"Node {self._cache.node_name}'s device plugin could not record the "
                                      f"allocation, and the kubelet will retry the pod: {exc}") from None

    def _allocate(self, requests: Sequence[Sequence[str]], device_gpus: list[Counter[int]]) -> list[ContainerResult]:
        shapes = [(len(ids), gpus) for ids, gpus in zip(requests, device_gpus, strict=True)]
        refreshed = False
        for _ in range(ATTEMPTS):
            matches = choose(waiting_pods(self._cache.pods(), self._served, self._decided), shapes)
            if matches is None:
                if not refreshed:
                    self._cache.refresh()  # the watch may not have shown the extender's bind yet
                    refreshed = True
                    continue
                raise NoPendingPod(self._no_pending([units for units, _ in shapes]))
            self._check_unit(matches[0])
            # Everything that can refuse the call happens before the one write below.
            grants = [self._grant(match) for match in matches]
            if self._record(matches):
                self._remember(matches, requests)
                return [container_environment(grant, self._isolation) for grant in grants]
        raise AllocationError(f"The pods on node {self._cache.node_name} kept changing while Allocate tried to "
                              f"record its choice ({ATTEMPTS} attempts); the kubelet will retry the pod.")

    def _no_pending(self, sizes: list[int]) -> str:
        pods = self._cache.pods()
        waiting = waiting_pods(pods, self._served, self._decided)
        return no_pending_message(self._cache.node_name, sizes, waiting, unplaced_pods(pods),
                                  served_containers(pods, sizes), self._written_at)

    def handed_out(self, device_ids: frozenset[str]) -> tuple[int, ...] | None:
        """The GPUs a container with these devices was given, if this process served it."""
        with self._lock:
            return self._handed.get(device_ids)

    def _record(self, matches: list[Match]) -> bool:
        """Write the matches onto their pod; ``False`` when the pod changed or vanished and must be matched again."""
        pod = matches[0].waiting.pod
        annotations = self._recorded(matches).annotations()
        try:
            updated = self._pods.annotate(pod.namespace, pod.name, pod.resource_version, annotations)
        except Conflict:
            try:
                self._cache.apply(self._pods.read(pod.namespace, pod.name))
            except NotFound:
                self._cache.forget(pod.key)
            return False
        except NotFound:
            self._cache.forget(pod.key)
            return False
        self._cache.apply(updated)
        first = matches[0]
        if first.moved:
            log.warning("The kubelet gave pod %s devices of GPU(s) %s, not the extender's %s; the pod gets the "
                        "devices' GPUs and its annotations now say so.", pod.key, _names(first.gpus),
                        _names(first.waiting.assignment.gpu_indices),
                        extra={"pod": pod.key, "gpus": list(first.gpus)})
        for match in matches:
            log.info("Allocated GPU(s) %s to container %s of pod %s (%d unit(s)).", _names(match.gpus),
                     match.container or "(all)", pod.key, match.units,
                     extra={"pod": pod.key, "container": match.container, "gpus": list(match.gpus),
                            "units": match.units})
        return True

    def _check_unit(self, match: Match) -> None:
        """Refuse a pod placed in another unit than this plugin advertises: its share would be off by 1024x."""
        recorded = match.waiting.assignment.unit
        unit = self._inventory.unit
        if recorded is not None and recorded is not unit:
            pod = match.waiting.pod
            message = (f"Pod {pod.key} was placed by the gpushare extender in {recorded.value} of GPU memory, but "
                       f"node {self._cache.node_name}'s device plugin advertises {unit.value}; gpushare refuses to "
                       "convert. Run the device plugin with the unit it had when the pod was placed, or delete and "
                       "recreate the pod.")
            log.error(message, extra={"pod": pod.key, "recorded_unit": recorded.value, "unit": unit.value})
            raise AllocationError(message)

    def _recorded(self, matches: list[Match]) -> Assignment:
        """The pod's assignment once these containers are served: the GPUs it really got, and what is done."""
        first, last = matches[0], matches[-1]
        waiting = first.waiting
        recorded = waiting.assignment
        if first.moved:
            recorded = moved_to(recorded, self._inventory, first.gpus)
        if len(waiting.containers) > 1:
            served = waiting.allocated | {m.container for m in matches}
            recorded = replace(recorded, allocated_containers=tuple(n for n, _ in waiting.containers if n in served))
        if last.waiting.is_last(last.container):
            recorded = replace(recorded, assigned=True,
                               gpu_uuids=tuple(self._gpu(i).uuid for i in first.gpus))
        return recorded

    def _remember(self, matches: list[Match], requests: Sequence[Sequence[str]]) -> None:
        first = matches[0]
        uid = first.waiting.pod.uid
        self._served[uid] = first.waiting.allocated | {m.container for m in matches}
        self._decided[uid] = first.gpus
        self._written_at[uid] = time.time()
        for ids in requests:
            self._handed[frozenset(ids)] = first.gpus
        while len(self._handed) > HANDED_OUT_MEMORY:
            self._handed.popitem(last=False)
        live = {p.uid for p in self._cache.pods()}
        for table in (self._served, self._decided, self._written_at):
            for gone in [u for u in table if u not in live and u != uid]:
                del table[gone]

    def _gpu(self, index: int) -> GPUDevice:
        try:
            return self._inventory.gpu(index)
        except KeyError:
            raise AllocationError(f"The extender placed a pod on GPU {index}, which node "
                                  f"{self._cache.node_name} does not have; check the node's "
                                  "gpushare.io/gpu-inventory annotation and the extender's view.") from None

    def _grant(self, match: Match) -> ContainerGrant:
        assignment = match.waiting.assignment
        gpus = [self._gpu(i) for i in match.gpus]
        unit = self._inventory.unit
        if assignment.exclusive:
            limits = [g.memory_mib for g in gpus]
        else:
            limits = split_evenly(match.units * unit.mib, len(gpus))
        pod_units = assignment.total or match.units
        return ContainerGrant(gpu_indices=match.gpus, gpu_uuids=tuple(g.uuid for g in gpus),
                              container_units=match.units, pod_units=pod_units,
                              gpu_units=unit.from_mib(gpus[0].memory_mib), limit_mib=tuple(limits),
                              compute_limit=assignment.compute_limit)


def moved_to(assignment: Assignment, inventory: Inventory, gpus: tuple[int, ...]) -> Assignment:
    """The assignment of a pod that really runs on ``gpus`` of this node, not where it was recorded."""
    return replace(assignment, gpu_indices=gpus, gpu_uuids=tuple(inventory.gpu(i).uuid for i in gpus),
                   gpu_memory=inventory.unit.from_mib(inventory.gpu(gpus[0]).memory_mib))


def _names(gpus: Sequence[int]) -> str:
    return ",".join(str(i) for i in gpus)
