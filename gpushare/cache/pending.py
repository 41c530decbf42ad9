"""The pods the watch shows waiting for a node, so that bind reads them here instead of asking the API server.

kube-scheduler binds a pod it has just seen in its own watch; the extender's watch has seen it too. Reading it
from here saves bind one of its three API calls. The view may lag the API server by a moment: bind writes with
the pod's resourceVersion as a precondition, so a stale view costs a conflict and a fresh read, never a wrong
write.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from gpushare.contract import PodInfo


class PendingPods:
    """Active pods without a node, by namespace/name; thread-safe."""

    def __init__(self) -> None:
        self._pods: dict[str, PodInfo] = {}
        self._lock = threading.Lock()

    def get(self, namespace: str, name: str) -> PodInfo | None:
        return self._pods.get(f"{namespace}/{name}")

    def update(self, pod: PodInfo) -> None:
        """Hold the pod while it waits for a node; forget it once bound, finished or terminating."""
        with self._lock:
            if pod.node_name or not pod.is_active:
                self._pods.pop(pod.key, None)
            else:
                self._pods[pod.key] = pod

    def delete(self, pod: PodInfo) -> None:
        with self._lock:
            self._pods.pop(pod.key, None)

    def replace(self, pods: Iterable[PodInfo]) -> None:
        """A fresh list: exactly its pending pods."""
        fresh = {p.key: p for p in pods if not p.node_name and p.is_active}
        with self._lock:
            self._pods = fresh

    def __len__(self) -> int:
        return len(self._pods)
