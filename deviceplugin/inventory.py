"""The node's GPUs with their live state (health, memory in use), and a way to wait for it to change.

Health: a critical XID marks a GPU unhealthy; it counts as healthy again once it has gone
``recovery_s`` seconds without another one. Two counters let readers wait only for what they care about:
``health_version`` (the device list the kubelet sees) and ``version`` (anything the node annotation shows).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from deviceplugin.gpus import GPUDevice, XidEvent
from gpushare.contract import GPUInventoryEntry, MemoryUnit


class Inventory:
    def __init__(self, gpus: list[GPUDevice], unit: MemoryUnit, recovery_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.gpus = tuple(gpus)
        self.unit = unit
        self.index_by_uuid = {g.uuid: g.index for g in gpus}
        self._by_index = {g.index: g for g in gpus}
        self._recovery_s = recovery_s
        self._clock = clock
        self._last_fault: dict[int, float] = {}
        self._used: dict[int, int] = {}
        self._changed = threading.Condition()
        self.version = 0
        self.health_version = 0

    def gpu(self, index: int) -> GPUDevice:
        return self._by_index[index]

    def has(self, index: int) -> bool:
        return index in self._by_index

    def healthy(self, index: int) -> bool:
        with self._changed:
            return index not in self._last_fault

    def used_mib(self, index: int) -> int | None:
        with self._changed:
            return self._used.get(index)

    def record(self, event: XidEvent) -> bool:
        """Count an XID; return whether it turned a healthy GPU unhealthy."""
        if not event.critical or event.gpu_index not in self._by_index:
            return False
        with self._changed:
            was_healthy = event.gpu_index not in self._last_fault
            self._last_fault[event.gpu_index] = self._clock()
            if was_healthy:
                self._bump(health=True)
            return was_healthy

    def recover(self) -> list[int]:
        """Mark healthy every GPU that has been quiet for the recovery period; return their indices."""
        with self._changed:
            now = self._clock()
            back = sorted(i for i, at in self._last_fault.items() if now - at >= self._recovery_s)
            for index in back:
                del self._last_fault[index]
            if back:
                self._bump(health=True)
            return back

    def seconds_to_recovery(self) -> float | None:
        """How long until the next unhealthy GPU could recover, or ``None`` when all are healthy."""
        with self._changed:
            if not self._last_fault:
                return None
            return max(0.0, min(self._last_fault.values()) + self._recovery_s - self._clock())

    def set_used(self, used: dict[int, int]) -> None:
        with self._changed:
            known = {i: mib for i, mib in used.items() if i in self._by_index}
            if known != self._used:
                self._used = known
                self._bump(health=False)

    def _bump(self, health: bool) -> None:
        self.version += 1
        if health:
            self.health_version += 1
        self._changed.notify_all()

    def wait(self, seen: int, timeout_s: float, health_only: bool = False) -> int:
        """Block until the (health) version passes ``seen`` or the timeout ends; return the current one."""

        def current() -> int:
            return self.health_version if health_only else self.version

        with self._changed:
            self._changed.wait_for(lambda: current() != seen, timeout=timeout_s)
            return current()

    def wake(self) -> None:
        """Release every waiter, e.g. when the plugin stops."""
        with self._changed:
            self._changed.notify_all()

    def entries(self) -> list[GPUInventoryEntry]:
        """The node annotation's view. Memory in use is rounded to the unit so that noise does not rewrite it."""
        with self._changed:
            return [GPUInventoryEntry(
                index=g.index, model=g.model, memory_mib=g.memory_mib, uuid=g.uuid,
                healthy=g.index not in self._last_fault, numa=g.numa, links=dict(g.links),
                used_mib=None if g.index not in self._used
                else self.unit.from_mib(self._used[g.index]) * self.unit.mib) for g in self.gpus]
