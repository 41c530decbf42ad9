"""The PodDisruptionBudgets of the cluster and the labels of bound pods: what preemption's count needs."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

from gpushare.contract import PodInfo
from gpushare.disruption import Budget, Candidate, count_violations
from gpushare.preemption import Chosen


class Budgets:
    """Fed by the watch of PodDisruptionBudgets and of pods; read by the preempt verb.

    ``synced`` stays false until the first list of budgets succeeded (an extender whose RBAC does not allow
    reading them falls back to kube-scheduler's own count, see ``gpushare.preemption``).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._budgets: dict[tuple[str, str], Budget] = {}
        self._labels: dict[str, Mapping[str, str]] = {}
        self.synced = False

    def replace(self, budgets: Iterable[Budget]) -> None:
        fresh = {(b.namespace, b.name): b for b in budgets}
        with self._lock:
            self._budgets = fresh
            self.synced = True

    def upsert(self, budget: Budget) -> None:
        with self._lock:
            self._budgets[(budget.namespace, budget.name)] = budget

    def delete(self, namespace: str, name: str) -> None:
        with self._lock:
            self._budgets.pop((namespace, name), None)

    def note_pods(self, pods: Iterable[PodInfo], replace: bool = False) -> None:
        """Remember the labels of bound, active pods (only those can be victims); forget the others."""
        with self._lock:
            if replace:
                self._labels = {}
            for pod in pods:
                if pod.node_name and pod.is_active and pod.labels:
                    self._labels[pod.key] = pod.labels
                else:
                    self._labels.pop(pod.key, None)

    def forget_pod(self, key: str) -> None:
        with self._lock:
            self._labels.pop(key, None)

    def __len__(self) -> int:
        return len(self._budgets)

    def count(self, chosen: Chosen) -> int:
        """The violations of evicting ``chosen`` (most important first), by kube-scheduler's rule."""
        with self._lock:
            budgets = list(self._budgets.values())
            candidates = [Candidate.of(key, self._labels.get(key, {})) for key, _ in chosen]
        return count_violations(candidates, budgets)

