"""Which nodes filter passed for which pod, lately: bind accepts only those.

kube-scheduler runs its own filter plugins (taints, affinity, resources) before it asks the extender's filter,
and binds a pod only to a node from the extender's answer. A bind for a node that this extender's filter did
not pass for that pod lately did not come from that sequence: it would skip every check kube-scheduler makes,
so it is refused before any API call. The ledger is bounded in entries and age: an entry older than
``TTL_S`` is gone (kube-scheduler binds within seconds of filter), and past ``MAX_PODS`` the oldest go first.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence

# Far above the few seconds between filter and bind, even for a pod whose bind waits behind many others.
TTL_S = 300.0
# About 100 bytes plus 8 per passed name and the names' strings per pod; an entry goes at bind, so only pods between
# filter and bind (or failing to bind) hold one, far fewer than this.
MAX_PODS = 100_000


class FilterLedger:
    def __init__(self, ttl_s: float = TTL_S, max_pods: int = MAX_PODS) -> None:
        self._ttl_s = ttl_s
        self._max_pods = max_pods
        self._entries: OrderedDict[str, tuple[float, tuple[str, ...]]] = OrderedDict()
        self._lock = threading.Lock()  # filter runs on the event loop, binds' checks too, prioritize never

    def record(self, pod: str, passed: Sequence[str]) -> None:
        """Filter passed ``passed`` for ``pod`` (its UID, else namespace/name); replaces its earlier answer."""
        # A tuple, not a set: one C-level copy per filter (hundreds of names), against one linear search per bind;
        # an entry lives from filter to bind, so only pods between the two hold their names.
        entry = (time.monotonic(), tuple(passed))
        with self._lock:
            self._entries[pod] = entry
            self._entries.move_to_end(pod)
            while len(self._entries) > self._max_pods:
                self._entries.popitem(last=False)

    def forget(self, pod: str) -> None:
        """The pod is bound: its entry has served (a retried bind of a bound pod is answered from the pod)."""
        with self._lock:
            self._entries.pop(pod, None)

    def problem(self, pod: str, node: str) -> str | None:
        """None when filter passed ``node`` for ``pod`` within the TTL; else why the bind is refused."""
        now = time.monotonic()
        with self._lock:
            entry = self._entries.get(pod)
            if entry is not None and now - entry[0] > self._ttl_s:
                del self._entries[pod]
                entry = None
        if entry is None:
            return (f"this extender replica did not filter the pod in the last {self._ttl_s:g} s, and binds only "
                    "pods that kube-scheduler filtered through it first")
        if node not in entry[1]:
            return (f"this extender's last filter for the pod did not pass node {node}, and a bind must name a "
                    "node that filter passed")
        return None
