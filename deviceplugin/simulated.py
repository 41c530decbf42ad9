"""A simulated GPU backend: one node of the YAML cluster description, with injectable faults and usage.

Tests and the demo drive it in process (``inject_xid``, ``set_used``, ``set_process_usage``) or, for a plugin
running as its own process, through a control file of JSON lines that it follows as it grows::

    {"gpu": 0, "xid": 79}                                  an XID event on GPU 0
    {"gpu": 0, "usedMiB": 5000}                            memory in use on GPU 0
    {"gpu": 0, "podUID": "...", "usedMiB": 5000}           memory a pod's processes hold on GPU 0

A line that is not one of these (not UTF-8, not JSON, an unknown key, a GPU the node does not have, a number
out of range) is skipped with a warning naming its line number; the follower never stops over one.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
from pathlib import Path
from typing import Any, TypeGuard

import watchfiles

from deviceplugin.gpus import GPUDevice, ProcessUsage, XidEvent
from gpushare.clusterspec import NodeSpec

log = logging.getLogger(__name__)

SIMULATED_NVLINK_SCORE = 100
# The control file is read this much at a time, and a longer line is skipped unparsed: one runaway writer must
# not make the plugin hold an unbounded line in memory.
READ_CHUNK = 64 * 1024
MAX_LINE_BYTES = 4096
# Caller text quoted in a warning is cut to this many characters.
SHOWN_CHARS = 60
# The longest pod UID or container ID a line may carry (Kubernetes UIDs have 36 characters, container IDs 64).
MAX_ID_CHARS = 128
KEYS = frozenset({"gpu", "xid", "usedMiB", "podUID", "containerID"})
FOLLOW_RETRY_S = 1.0


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
        self._line = 0
        self._skipping = False
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
        target = self._control.resolve()
        while not self._stop.is_set():
            try:
                self._read_new_lines()
                for _ in watchfiles.watch(target.parent, watch_filter=lambda _change, path: Path(path) == target,
                                          stop_event=self._stop, debounce=200, step=20, rust_timeout=1000,
                                          yield_on_timeout=True):
                    self._read_new_lines()
            except Exception as exc:  # injected faults stop for good if this thread ends, so it never does
                log.warning("Following the simulation control file %s failed (%s); trying again in %.0f s.",
                            self._control, str(exc)[:SHOWN_CHARS], FOLLOW_RETRY_S)
                self._stop.wait(FOLLOW_RETRY_S)

    def _read_new_lines(self) -> None:
        assert self._control is not None
        while True:
            try:
                with self._control.open("rb") as handle:
                    if os.fstat(handle.fileno()).st_size < self._offset:
                        log.warning("The simulation control file %s shrank; reading it again from its start.",
                                    self._control)
                        self._offset, self._line, self._skipping = 0, 0, False
                    handle.seek(self._offset)
                    data = handle.read(READ_CHUNK)
            except OSError as exc:
                log.warning("Cannot read the simulation control file %s: %s.", self._control, exc.strerror)
                return
            *complete, rest = data.split(b"\n")
            consumed = len(data) - len(rest)
            for raw in complete:
                self._line += 1
                if self._skipping:  # the end of an overlong line, reported when it began
                    self._skipping = False
                    continue
                self._take(self._line, raw)
            if len(rest) > MAX_LINE_BYTES and not self._skipping:
                self._skip(self._line + 1, f"it is longer than {MAX_LINE_BYTES} bytes")
                self._skipping = True
            if self._skipping:
                consumed = len(data)
            self._offset += consumed
            if len(data) < READ_CHUNK:
                return

    def _take(self, number: int, raw: bytes) -> None:
        if not raw.strip():
            return
        if len(raw) > MAX_LINE_BYTES:
            self._skip(number, f"it is longer than {MAX_LINE_BYTES} bytes")
            return
        try:
            command = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            self._skip(number, "it is not UTF-8 text")
            return
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's stack
            self._skip(number, f"{_shown(raw.decode('utf-8'))} is not JSON")
            return
        problem = self._apply(command)
        if problem is not None:
            self._skip(number, problem)

    def _skip(self, number: int, problem: str) -> None:
        log.warning("Skipping line %d of the simulation control file %s: %s. A line is a JSON object such as "
                    '{"gpu": 0, "xid": 79}, {"gpu": 0, "usedMiB": 5000} or {"gpu": 0, "podUID": "<uid>", '
                    '"usedMiB": 5000}.', number, self._control, problem,
                    extra={"line": number, "file": str(self._control)})

    def _apply(self, command: Any) -> str | None:
        """Carry out one control line; the problem, as a phrase, when it cannot be."""
        if not isinstance(command, dict):
            return f"it holds a JSON {type(command).__name__}, not an object"
        unknown = sorted(str(k) for k in command if k not in KEYS)
        if unknown:
            names = ", ".join(_shown(k) for k in unknown[:3])
            return f"it has unknown key(s) {names}; the keys are {', '.join(sorted(KEYS))}"
        gpus = len(self._node.gpus)
        gpu = command.get("gpu")
        if not _whole(gpu) or not 0 <= gpu < gpus:
            allowed = f"0 to {gpus - 1}" if gpus else "none"
            return f"\"gpu\" is {_shown(json.dumps(gpu))}, but node {self._node.name} has GPUs {allowed}"
        if ("xid" in command) == ("usedMiB" in command):
            return 'it must have exactly one of "xid" and "usedMiB"'
        if "xid" in command:
            xid = command["xid"]
            if "podUID" in command or "containerID" in command:
                return '"podUID" and "containerID" go with "usedMiB", not "xid"'
            if not _whole(xid) or xid < 1:
                return f"\"xid\" is {_shown(json.dumps(xid))}; it must be a whole number from 1"
            self.inject_xid(gpu, xid)
            return None
        used, memory = command["usedMiB"], self._node.gpus[gpu].memory_mib
        if not _whole(used) or not 0 <= used <= memory:
            return f"\"usedMiB\" is {_shown(json.dumps(used))}; GPU {gpu} has {memory} MiB, so it must be 0 to {memory}"
        if "podUID" not in command:
            if "containerID" in command:
                return '"containerID" needs a "podUID"'
            self.set_used(gpu, used)
            return None
        pod, container = command["podUID"], command.get("containerID", "")
        for key, value in (("podUID", pod), ("containerID", container)):
            if not isinstance(value, str) or len(value) > MAX_ID_CHARS or (key == "podUID" and not value):
                return f"{key} is {_shown(json.dumps(value))}; it must be a string of 1 to {MAX_ID_CHARS} characters"
        self.set_process_usage(ProcessUsage(gpu, used, pod, container))
        return None


def _whole(value: object) -> TypeGuard[int]:
    """A JSON whole number: not a bool (a JSON true is no GPU), not a float (1e400 reads as infinity)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."
