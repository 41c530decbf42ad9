"""Lists and watches nodes and pods through the kubernetes client and feeds a ``ClusterCache``."""

from __future__ import annotations

import logging
from typing import Any

from gpushare.cache.state import ClusterCache
from gpushare.kube.convert import node_info, pod_info
from gpushare.kube.informer import Informer, Obj

log = logging.getLogger(__name__)


class ClusterWatch:
    """Lists and watches nodes and pods through the kubernetes client and feeds a ``ClusterCache``.

    ``core_api`` is a ``kubernetes.client.CoreV1Api``; objects travel as raw JSON dicts for speed.
    """

    def __init__(self, core_api: Any, cache: ClusterCache, watch_timeout_s: int = 300) -> None:
        self.cache = cache
        self._nodes = Informer(core_api.list_node, on_sync=self._sync_nodes, on_event=self._node_event,
                               kind="nodes", watch_timeout_s=watch_timeout_s)
        self._pods = Informer(core_api.list_pod_for_all_namespaces, on_sync=self._sync_pods,
                              on_event=self._pod_event, kind="pods", watch_timeout_s=watch_timeout_s)

    def start(self) -> None:
        self._nodes.start()
        self._pods.start()

    def stop(self) -> None:
        self._pods.stop()
        self._nodes.stop()

    @property
    def synced(self) -> bool:
        return self._nodes.synced.is_set() and self._pods.synced.is_set()

    def wait_synced(self, timeout_s: float) -> bool:
        return self._nodes.synced.wait(timeout_s) and self._pods.synced.wait(timeout_s)

    def _sync_nodes(self, items: list[Obj]) -> None:
        self.cache.replace_nodes(node_info(o) for o in items)
        log.info("node list loaded", extra={"nodes": len(items)})

    def _node_event(self, kind: str, obj: Obj) -> None:
        info = node_info(obj)
        if kind == "DELETED":
            self.cache.delete_node(info.name)
        else:
            self.cache.upsert_node(info)

    def _sync_pods(self, items: list[Obj]) -> None:
        self.cache.replace_pods(pod_info(o) for o in items)
        log.info("pod list loaded", extra={"pods": len(items)})

    def _pod_event(self, kind: str, obj: Obj) -> None:
        pod = pod_info(obj)
        if kind == "DELETED":
            self.cache.delete_pod(pod)
        else:
            self.cache.upsert_pod(pod)
