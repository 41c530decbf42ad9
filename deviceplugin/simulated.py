"""A simulated GPU backend: one node of the YAML cluster description, with injectable faults and usage.

Tests and the demo drive it in process (``inject_xid``, ``set_used``, ``set_process_usage``) or, for a plugin
running as its own process, through a control file of JSON lines that it follows as it grows::

    {"gpu": 0, "xid": 79}                                  an XID event on GPU 0
    {"gpu": 0, "usedMiB": 5000}                            memory in use on GPU 0
    {"gpu": 0, "podUID": "...", "usedMiB": 5000}           memory a pod's processes hold on GPU 0
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from pathlib import Path

import watchfiles

from deviceplugin.gpus import GPUDevice, ProcessUsage, XidEvent
from gpushare.clusterspec import NodeSpec

log = logging.getLogger(__name__)

SIMULATED_NVLINK_SCORE = 100


class SimulatedBackend:
    def __init__(self, node: NodeSpec, control_file: Path | None = None) -> None:
        self._node = node
        self._lock = threading.Lock()
        self._used = {i: gpu.used_mib for i, gpu in enumerate(node.gpus)}
        self._processes: dict[tuple[int, str, str], int] = {}
        self._events: queue.Queue[XidEvent] = queue.Queue()
        self._stop = threading.Event()
        self._control = control_file
        self._offset = 0
        self._follower: threading.Thread | None = None
        if control_file is not None:
            control_file.touch()
            self._follower = threading.Thread(target=self._follow, name="sim-control", daemon=True)
            self._follower.start()

    def discover(self) -> list[GPUDevice]:
        if not self._node.gpus:
            log.warning("The cluster description gives node %s no GPUs, so it advertises none.", self._node.name)
        peers: dict[int, set[int]] = {i: set() for i in range(len(self._node.gpus))}
        for index, gpu in enumerate(self._node.gpus):
            for peer in gpu.nvlink:
                if peer in peers and peer != index:
                    peers[index].add(peer)
                    peers[peer].add(index)
        return [GPUDevice(index=i, uuid=self._node.gpu_uuid(i), model=gpu.model, memory_mib=gpu.memory_mib,
                          minor=i, numa=gpu.numa, links={p: SIMULATED_NVLINK_SCORE for p in sorted(peers[i])})
                for i, gpu in enumerate(self._node.gpus)]

    def inject_xid(self, gpu_index: int, xid: int) -> None:
        self._events.put(XidEvent(gpu_index, xid))

    def set_used(self, gpu_index: int, used_mib: int) -> None:
        with self._lock:
            self._used[gpu_index] = used_mib

    def set_process_usage(self, usage: ProcessUsage) -> None:
        with self._lock:
            self._processes[(usage.gpu_index, usage.pod_uid, usage.container_id)] = usage.used_mib

    def used_mib(self) -> dict[int, int]:
        with self._lock:
            return dict(self._used)

    def process_usage(self) -> list[ProcessUsage]:
        with self._lock:
            return [ProcessUsage(gpu, used, pod, container)
                    for (gpu, pod, container), used in self._processes.items()]

    def wait_event(self, timeout_s: float) -> XidEvent | None:
        try:
            return self._events.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def close(self) -> None:
        self._stop.set()
        if self._follower is not None:
            self._follower.join(timeout=5)

    def _follow(self) -> None:
        assert self._control is not None
        self._read_new_lines()
        target = self._control.resolve()
        for _ in watchfiles.watch(target.parent, watch_filter=lambda _change, path: Path(path) == target,
                                  stop_event=self._stop, debounce=200, step=20, rust_timeout=1000,
                                  yield_on_timeout=True):
            self._read_new_lines()

    def _read_new_lines(self) -> None:
        assert self._control is not None
        try:
            with self._control.open("rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except OSError as exc:
            log.warning("Cannot read the simulation control file %s: %s.", self._control, exc.strerror)
            return
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        for line in complete.decode().splitlines():
            if line.strip():
                self._apply(line)

    def _apply(self, line: str) -> None:
        try:
            command = json.loads(line)
            gpu = int(command["gpu"])
            if "xid" in command:
                self.inject_xid(gpu, int(command["xid"]))
            elif "podUID" in command:
                self.set_process_usage(ProcessUsage(gpu, int(command["usedMiB"]), str(command["podUID"]),
                                                    str(command.get("containerID", ""))))
            else:
                self.set_used(gpu, int(command["usedMiB"]))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("Ignoring simulation control line %r: it must be a JSON object with \"gpu\" and one "
                        "of \"xid\" or \"usedMiB\" (%s).", line, exc)
