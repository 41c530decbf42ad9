"""The pods bound to this node, kept current by a node-scoped watch (``spec.nodeName=<node>``).

Allocate reads this cache instead of listing pods. The plugin's own writes are applied at once from the API
server's reply, and an event older than what the cache holds is ignored, so a lagging watch never undoes them.
``pods()`` lists them in the order they arrived bound: the order the kubelet, watching the same API server,
learns of them and admits them, which is what tells apart two pods that an Allocate call could be for.
"""

from __future__ import annotations

import threading

from gpushare.contract import PodInfo
from gpushare.kube.api import Obj, Pods
from gpushare.kube.convert import pod_info
from gpushare.kube.informer import Informer


def _version(obj: Obj) -> int | None:
    text = str(obj.get("metadata", {}).get("resourceVersion", ""))
    return int(text) if text.isdigit() else None


def _key(obj: Obj) -> str:
    meta = obj.get("metadata", {})
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


class PodCache:
    def __init__(self, pods: Pods, node_name: str) -> None:
        self._api = pods
        self.node_name = node_name
        self._selector = f"spec.nodeName={node_name}"
        self._lock = threading.Lock()
        self._pods: dict[str, tuple[Obj, PodInfo]] = {}
        self._informer = Informer(pods.list_call, on_sync=self._replace,
                                  on_event=self._event, kind="pods", field_selector=self._selector)

    def start(self) -> None:
        self._informer.start()

    def stop(self) -> None:
        self._informer.stop()

    def wait_synced(self, timeout_s: float) -> bool:
        return self._informer.synced.wait(timeout_s)

    @property
    def synced(self) -> bool:
        return self._informer.synced.is_set()

    def pods(self) -> list[PodInfo]:
        with self._lock:
            return [info for _, info in self._pods.values()]

    def get(self, key: str) -> PodInfo | None:
        with self._lock:
            entry = self._pods.get(key)
            return entry[1] if entry else None

    def raw(self, key: str) -> Obj | None:
        with self._lock:
            entry = self._pods.get(key)
            return entry[0] if entry else None

    def refresh(self) -> None:
        """List the node's pods now: Allocate does this once when the watch has not shown a bind yet."""
        self._replace(self._api.list(field_selector=self._selector))

    def apply(self, obj: Obj) -> None:
        """Take in a pod the plugin just wrote (or re-read)."""
        self._event("MODIFIED", obj)

    def forget(self, key: str) -> None:
        with self._lock:
            self._pods.pop(key, None)

    def _replace(self, items: list[Obj]) -> None:
        listed = {_key(obj): obj for obj in items if obj.get("spec", {}).get("nodeName") == self.node_name}
        with self._lock:
            # Pods already known keep their place; new ones follow in the order they were written.
            order = [k for k in self._pods if k in listed]
            order += sorted((k for k in listed if k not in self._pods), key=lambda k: _version(listed[k]) or 0)
            self._pods = {k: (listed[k], pod_info(listed[k])) for k in order}

    def _event(self, kind: str, obj: Obj) -> None:
        key = _key(obj)
        with self._lock:
            if kind == "DELETED":
                self._pods.pop(key, None)
                return
            held = self._pods.get(key)
            if held is not None:
                old, new = _version(held[0]), _version(obj)
                same_pod = held[1].uid == str(obj.get("metadata", {}).get("uid") or "")
                if same_pod and old is not None and new is not None and new < old:
                    return
            self._pods[key] = (obj, pod_info(obj))
