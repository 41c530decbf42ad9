"""Which placement policy decides for a pod, and the workload the learning policies learn from."""

from __future__ import annotations

import threading
from collections import OrderedDict

from gpushare.contract import PodRequest
from gpushare.policies import Policy, make_policy
from gpushare.policies.workload import Shape, WorkloadDistribution

# How many pod UIDs to remember as already observed; older ones may be observed again, which only
# nudges the workload statistics.
OBSERVED_PODS = 100_000


class PolicyBook:
    """One instance per policy name, all sharing one workload distribution.

    Every GPU pod feeds the workload once, whichever policy places it: a learning policy chosen by a few
    pods must still know what the rest of the cluster asks for.
    """

    def __init__(self, default: str) -> None:
        self.default = default
        self.workload = WorkloadDistribution()
        self._policies: dict[str, Policy] = {default: make_policy(default, self.workload)}
        self._observed: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def for_request(self, request: PodRequest) -> Policy:
        """The pod's own policy if it names one, else the default; ``ValueError`` for an unknown name."""
        name = request.policy or self.default
        policy = self._policies.get(name)
        if policy is None:
            with self._lock:
                policy = self._policies.get(name)
                if policy is None:
                    policy = self._policies[name] = make_policy(name, self.workload)
        return policy

    def observe_once(self, uid: str, request: PodRequest) -> None:
        """Count the pod in the workload the first time the extender sees it."""
        self.for_request(request)  # an unknown policy name fails here, before anything is counted
        with self._lock:
            if uid in self._observed:
                return
            self._observed[uid] = None
            if len(self._observed) > OBSERVED_PODS:
                self._observed.popitem(last=False)
            self.workload.observe(Shape.of(request))
