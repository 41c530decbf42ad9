"""preempt: which of kube-scheduler's proposed victims free the right GPUs, node by node.

kube-scheduler calls this after a pod fit nowhere, with the victims its own dry run found on each candidate
node. Its dry run counts GPU memory per node, so its victims may free memory on GPUs the pod cannot use; the
answer replaces them with the victims the cache's per-GPU view needs (``gpushare.preemption``), and leaves out
the nodes where no eviction of lower-priority pods would make room. Victims are listed highest priority first,
as kube-scheduler's choice of node reads them, with the PodDisruptionBudgets they would violate counted by
kube-scheduler's rule once the budgets have been listed (until then, kube-scheduler's own count bounds it).
"""

from __future__ import annotations

from typing import Any

from extender.gang import gang_of
from extender.placement import RequestCache
from extender.wire import PreemptionArgs, preemption_result
from gpushare.cache.budgets import Budgets
from gpushare.cache.state import ClusterCache


class Preempt:
    def __init__(self, cache: ClusterCache, requests: RequestCache, budgets: Budgets) -> None:
        self.cache = cache
        self.requests = requests
        self.budgets = budgets

    def __call__(self, args: PreemptionArgs) -> dict[str, Any]:
        try:
            request = self.cache.resolve(self.requests.request(args.pod))
        except ValueError:  # filter has already told the pod's owner; a pod that cannot be placed evicts nobody
            return preemption_result({})
        if not request.preempts or gang_of(args.pod) is not None:
            # A gang member evicts nobody: room for one member is no use to a gang that cannot place the others,
            # and the gang's own plan decides where its members go.
            return preemption_result({})
        if not request.gpu_count:
            # kube-scheduler's dry run already judged everything a pod without GPUs needs: its victims stand.
            return preemption_result({node: (uids, violations)
                                      for node, (uids, violations) in args.victims.items() if uids})
        found = self.cache.preempt(request, args.pod.uid, args.victims,
                                   self.budgets.count if self.budgets.synced else None)
        return preemption_result({node: ([v.uid for v in chosen.victims], chosen.pdb_violations)
                                  for node, chosen in found.items()})
