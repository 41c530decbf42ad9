"""Lists and watches nodes and pods through the kubernetes client and feeds a ``ClusterCache``."""

from __future__ import annotations

import logging

from gpushare.cache.state import ClusterCache
from gpushare.kube.api import ListCall, Obj
from gpushare.kube.convert import node_info, pod_info
from gpushare.kube.informer import Informer

log = logging.getLogger(__name__)


class ClusterWatch:
    """Lists and watches nodes and pods through the kubernetes client and feeds a ``ClusterCache``.

    ``list_nodes`` and ``list_pods`` are ``Nodes.list_call`` and ``Pods.list_call``; objects travel as raw JSON.
    """

    def __init__(self, list_nodes: ListCall, list_pods: ListCall, cache: ClusterCache,
                 watch_timeout_s: int = 300) -> None:
        self.cache = cache
        self._nodes = Informer(list_nodes, on_sync=self._sync_nodes, on_event=self._node_event,
                               kind="nodes", watch_timeout_s=watch_timeout_s)
        self._pods = Informer(list_pods, on_sync=self._sync_pods,
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
