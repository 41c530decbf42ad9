"""Lists and watches nodes, pods and PodDisruptionBudgets through the kubernetes client and feeds the caches."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

from gpushare.cache.budgets import Budgets
from gpushare.cache.gangs import GangIndex
from gpushare.cache.pending import PendingPods
from gpushare.cache.state import ClusterCache
from gpushare.contract import PodInfo, names_a_gang
from gpushare.kube.api import ListCall, Obj
from gpushare.kube.convert import budget_info, node_info, pod_info
from gpushare.kube.informer import Informer

log = logging.getLogger(__name__)


class ClusterWatch:
    """Lists and watches nodes and pods through the kubernetes client and feeds a ``ClusterCache`` and the
    ``PendingPods`` that bind reads.

    ``list_nodes`` and ``list_pods`` are ``Nodes.list_call`` and ``Pods.list_call``; objects travel as raw JSON.
    With ``list_budgets`` (``DisruptionBudgets.list_call``) it also keeps ``budgets``, which preemption reads;
    readiness does not wait for them.
    """

    def __init__(self, list_nodes: ListCall, list_pods: ListCall, cache: ClusterCache,
                 watch_timeout_s: int = 300, list_budgets: ListCall | None = None) -> None:
        self.cache = cache
        self.pending = PendingPods()
        self.budgets = Budgets()
        self.gangs = GangIndex()
        # Streamed: the cache takes each page as it arrives, so start-up holds one page of raw JSON objects,
        # not every pod of the cluster (bench/bench_startup.py measures the difference).
        self._nodes = Informer(list_nodes, on_sync=self._sync_nodes, on_event=self._node_event,
                               kind="nodes", watch_timeout_s=watch_timeout_s, streamed=True)
        self._pods = Informer(list_pods, on_sync=self._sync_pods,
                              on_event=self._pod_event, kind="pods", watch_timeout_s=watch_timeout_s, streamed=True)
        self._budgets = None if list_budgets is None else Informer(
            list_budgets, on_sync=self._sync_budgets, on_event=self._budget_event, kind="poddisruptionbudgets",
            watch_timeout_s=watch_timeout_s)

    def start(self) -> None:
        self._nodes.start()
        self._pods.start()
        if self._budgets is not None:
            self._budgets.start()

    def stop(self) -> None:
        if self._budgets is not None:
            self._budgets.stop()
        self._pods.stop()
        self._nodes.stop()

    @property
    def synced(self) -> bool:
        return self._nodes.synced.is_set() and self._pods.synced.is_set()

    def wait_synced(self, timeout_s: float) -> bool:
        return self._nodes.synced.wait(timeout_s) and self._pods.synced.wait(timeout_s)

    def _sync_nodes(self, items: Iterator[Obj]) -> None:
        counted = _Counted(items)
        self.cache.replace_nodes(node_info(o) for o in counted)
        log.info("node list loaded", extra={"nodes": counted.count})

    def _node_event(self, kind: str, obj: Obj) -> None:
        info = node_info(obj)
        if kind == "DELETED":
            self.cache.delete_node(info.name)
        else:
            self.cache.upsert_node(info)

    def _sync_pods(self, items: Iterator[Obj]) -> None:
        counted = _Counted(items)
        pending: list[PodInfo] = []
        grouped: list[PodInfo] = []

        bound: list[PodInfo] = []

        def noting_pending(pods: Iterable[PodInfo]) -> Iterator[PodInfo]:
            for pod in pods:
                if not pod.node_name:
                    pending.append(pod)
                elif pod.labels:
                    bound.append(pod)
                if pod.labels and names_a_gang(pod):
                    grouped.append(pod)
                yield pod

        self.cache.replace_pods(noting_pending(pod_info(o) for o in counted))
        self.pending.replace(pending)
        self.budgets.note_pods(bound, replace=True)
        self.gangs.replace(grouped)
        log.info("pod list loaded", extra={"pods": counted.count})

    def _pod_event(self, kind: str, obj: Obj) -> None:
        pod = pod_info(obj)
        if kind == "DELETED":
            self.cache.delete_pod(pod)
            self.pending.delete(pod)
            self.budgets.forget_pod(pod.key)
            self.gangs.delete(pod)
        else:
            self.cache.upsert_pod(pod)
            self.pending.update(pod)
            self.gangs.update(pod)
            self.budgets.note_pods([pod])

    def _sync_budgets(self, items: list[Obj]) -> None:
        self.budgets.replace(budget_info(o) for o in items)
        log.info("PodDisruptionBudget list loaded", extra={"budgets": len(self.budgets)})

    def _budget_event(self, kind: str, obj: Obj) -> None:
        budget = budget_info(obj)
        if kind == "DELETED":
            self.budgets.delete(budget.namespace, budget.name)
        else:
            self.budgets.upsert(budget)


class _Counted:
    """Counts the objects of a streamed list as the cache consumes them, for the log line."""

    def __init__(self, items: Iterable[Obj]) -> None:
        self._items = items
        self.count = 0

    def __iter__(self) -> Iterator[Obj]:
        for item in self._items:
            self.count += 1
            yield item
