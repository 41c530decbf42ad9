"""Which pods the watch shows in each gang, pending and bound, so that a member's filter sees the whole gang.

Rebuilt from the API alone (the pods' labels, their nodes), so a restarted extender counts the members its
predecessor bound as placed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from gpushare.contract import PodInfo, RequestError, read_gang


class GangIndex:
    """Active pods with a gang label, by gang (namespace/name) and pod key; thread-safe."""

    def __init__(self) -> None:
        self._gangs: dict[str, dict[str, PodInfo]] = {}
        self._pod_gang: dict[str, str] = {}
        self._lock = threading.Lock()

    def members(self, gang: str) -> list[PodInfo]:
        with self._lock:
            return list(self._gangs.get(gang, {}).values())

    def pending_gangs(self) -> set[str]:
        """The gangs with at least one member waiting for a node."""
        with self._lock:
            return {gang for gang, members in self._gangs.items() if any(not m.node_name for m in members.values())}

    def update(self, pod: PodInfo) -> None:
        """Hold the pod under its gang while it is active; forget it once finished, terminating or ungrouped."""
        ref = _gang(pod)
        with self._lock:
            self._forget(pod.key)
            if ref is not None:
                self._gangs.setdefault(ref, {})[pod.key] = pod
                self._pod_gang[pod.key] = ref

    def delete(self, pod: PodInfo) -> None:
        with self._lock:
            self._forget(pod.key)

    def replace(self, pods: Iterable[PodInfo]) -> None:
        """A fresh list: exactly its grouped pods."""
        gangs: dict[str, dict[str, PodInfo]] = {}
        pod_gang: dict[str, str] = {}
        for pod in pods:
            ref = _gang(pod)
            if ref is not None:
                gangs.setdefault(ref, {})[pod.key] = pod
                pod_gang[pod.key] = ref
        with self._lock:
            self._gangs, self._pod_gang = gangs, pod_gang

    def _forget(self, key: str) -> None:
        gang = self._pod_gang.pop(key, None)
        if gang is None:
            return
        members = self._gangs[gang]
        del members[key]
        if not members:
            del self._gangs[gang]


def _gang(pod: PodInfo) -> str | None:
    """The key of the active pod's gang; ``None`` when it is in none, has finished, or names its gang wrongly
    (its filter tells the owner why)."""
    if not pod.is_active:
        return None
    try:
        ref = read_gang(pod)
    except RequestError:
        return None
    return None if ref is None else ref.key
