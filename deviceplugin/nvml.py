"""GPU discovery and monitoring through NVML (``pynvml`` from the ``nvidia-ml-py`` package).

A node without the driver, or without GPUs, is not an error: the backend logs one sentence saying so and
reports no GPUs, so the plugin keeps serving an empty device list.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pynvml

from deviceplugin.gpus import GPUDevice, ProcessUsage, XidEvent

log = logging.getLogger(__name__)

MIB = 1 << 20

# HAMi's pair scores by NVML's common-ancestor level of two GPUs; an NVLink scores 100 per link instead.
PCIE_SCORES = {
    pynvml.NVML_TOPOLOGY_INTERNAL: 60,  # same board
    pynvml.NVML_TOPOLOGY_SINGLE: 50,  # one PCIe switch
    pynvml.NVML_TOPOLOGY_MULTIPLE: 40,  # several PCIe switches
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: 30,
    pynvml.NVML_TOPOLOGY_NODE: 20,  # same CPU
    pynvml.NVML_TOPOLOGY_SYSTEM: 10,  # across CPUs
}
NVLINK_SCORE = 100

_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_CONTAINER_ID = re.compile(r"([0-9a-f]{64})(?:\.scope)?$")


def pair_score(common_ancestor: int, nvlinks: int) -> int:
    """HAMi's score for two GPUs: 100 per NVLink joining them, else their PCIe distance."""
    if nvlinks:
        return NVLINK_SCORE * nvlinks
    return PCIE_SCORES.get(common_ancestor, PCIE_SCORES[pynvml.NVML_TOPOLOGY_SYSTEM])


def pod_of_cgroup(text: str) -> tuple[str, str] | None:
    """The pod UID and container ID in a ``/proc/<pid>/cgroup`` file (cgroupfs and systemd layouts)."""
    for line in text.splitlines():
        path = line.rsplit(":", 1)[-1]
        pod = _POD_UID.search(path)
        if pod:
            container = _CONTAINER_ID.search(path)
            return pod.group(1).replace("_", "-"), container.group(1) if container else ""
    return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bus_id(value: Any) -> str:
    """NVML writes an 8-digit PCI domain; sysfs and comparisons use the short lowercase form."""
    return _text(value).lower()[-12:]


class NvmlBackend:
    def __init__(self) -> None:
        self._closed = threading.Event()
        self._handles: list[Any] = []
        self._events: Any = None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound:
            log.warning("The NVIDIA driver is not installed on this node (NVML library not found), so it "
                        "advertises no GPUs; install the driver and restart the device plugin.")
            self._ready = False
        except pynvml.NVMLError as exc:
            log.warning("NVML failed to start (%s), so this node advertises no GPUs; check the driver with "
                        "nvidia-smi and restart the device plugin.", exc, extra={"nvml_error": str(exc)})
            self._ready = False
        else:
            self._ready = True

    def discover(self) -> list[GPUDevice]:
        if not self._ready:
            return []
        count = pynvml.nvmlDeviceGetCount()
        if count == 0:
            log.warning("NVML reports no GPUs on this node, so it advertises none.")
            return []
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        buses = [_bus_id(pynvml.nvmlDeviceGetPciInfo(h).busId) for h in self._handles]
        gpus = []
        for index, handle in enumerate(self._handles):
            nvlinks = self._nvlink_peers(handle, buses)
            links = {}
            for peer, other in enumerate(self._handles):
                if peer != index:
                    links[peer] = pair_score(self._common_ancestor(handle, other), nvlinks[peer])
            gpus.append(GPUDevice(
                index=index, uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                model=_text(pynvml.nvmlDeviceGetName(handle)).replace(" ", "-"),
                memory_mib=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // MIB,
                minor=self._optional(pynvml.nvmlDeviceGetMinorNumber, handle),
                numa=self._numa(handle, buses[index]), links=links))
        self._register_events()
        return gpus

    @staticmethod
    def _optional(query: Any, *args: Any) -> Any:
        try:
            return query(*args)
        except pynvml.NVMLError:
            return None

    def _numa(self, handle: Any, bus: str) -> int | None:
        node = self._optional(pynvml.nvmlDeviceGetNumaNodeId, handle)
        if node is None:
            try:
                node = int(Path(f"/sys/bus/pci/devices/{bus}/numa_node").read_text())
            except (OSError, ValueError):
                return None
        return int(node) if int(node) >= 0 else None

    def _nvlink_peers(self, handle: Any, buses: list[str]) -> Counter[int]:
        peers: Counter[int] = Counter()
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                    continue
                remote = _bus_id(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
            except pynvml.NVMLError:
                break
            if remote in buses:
                peers[buses.index(remote)] += 1
        return peers

    def _common_ancestor(self, first: Any, second: Any) -> int:
        level = self._optional(pynvml.nvmlDeviceGetTopologyCommonAncestor, first, second)
        return pynvml.NVML_TOPOLOGY_SYSTEM if level is None else int(level)

    def _register_events(self) -> None:
        try:
            self._events = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.warning("NVML cannot watch XID events (%s); GPU health will not be tracked.", exc)
            return
        for index, handle in enumerate(self._handles):
            try:
                pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, self._events)
            except pynvml.NVMLError as exc:
                log.warning("GPU %d does not report XID events (%s); its health will not be tracked.",
                            index, exc, extra={"gpu": index})

    def used_mib(self) -> dict[int, int]:
        used = {}
        for index, handle in enumerate(self._handles):
            info = self._optional(pynvml.nvmlDeviceGetMemoryInfo, handle)
            if info is not None:
                used[index] = int(info.used) // MIB
        return used

    def process_usage(self) -> list[ProcessUsage]:
        usages = []
        for index, handle in enumerate(self._handles):
            for process in self._optional(pynvml.nvmlDeviceGetComputeRunningProcesses, handle) or ():
                owner = self._owner(int(process.pid))
                if owner is not None and process.usedGpuMemory is not None:
                    usages.append(ProcessUsage(index, int(process.usedGpuMemory) // MIB, *owner))
        return usages

    @staticmethod
    def _owner(pid: int) -> tuple[str, str] | None:
        """The pod of a host PID; the plugin needs hostPID to see them."""
        try:
            return pod_of_cgroup(Path(f"/proc/{pid}/cgroup").read_text())
        except OSError:
            return None

    def wait_event(self, timeout_s: float) -> XidEvent | None:
        if self._events is None:
            self._closed.wait(timeout_s)
            return None
        try:
            data = pynvml.nvmlEventSetWait_v2(self._events, int(timeout_s * 1000))
        except pynvml.NVMLError_Timeout:
            return None
        return XidEvent(gpu_index=int(pynvml.nvmlDeviceGetIndex(data.device)), xid=int(data.eventData))

    def close(self) -> None:
        self._closed.set()
        if self._ready:
            if self._events is not None:
                pynvml.nvmlEventSetFree(self._events)
                self._events = None
            pynvml.nvmlShutdown()
            self._ready = False
