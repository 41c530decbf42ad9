"""Which placement policy decides for a pod, and the workload the learning policies learn from."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping

from gpushare.contract import PodInfo, PodRequest, host_requests, parse_request, requests_gpu
from gpushare.policies import Policy, make_policy
from gpushare.policies.workload import Shape, WorkloadDistribution

# How many pod UIDs to remember as already observed; older ones may be observed again, which only
# nudges the workload statistics.
OBSERVED_PODS = 100_000


def placement_request(pod: PodInfo) -> PodRequest:
    """What the policies place: the pod's GPU request, or for a pod that asks for no GPU its CPU and memory.

    kube-scheduler sends pods without a gpushare resource only when the extender's configuration lists no
    ``managedResources``; the policies then place those too (``fgd-lookahead`` steers them to CPU-rich
    nodes). ``RequestError`` if the request cannot be read.
    """
    if requests_gpu(pod):
        return parse_request(pod)
    cpu, memory = host_requests(pod)
    return PodRequest(per_gpu=0, gpu_count=0, cpu_milli=cpu, memory_mib=memory)


class PolicyBook:
    """One instance per policy name, all sharing one workload distribution.

    Every pod the extender is asked about feeds the workload once, whichever policy places it: a learning
    policy chosen by a few pods must still know what the rest of the cluster asks for. ``workload_seed``
    (shape -> weight, weights counted as pods, as ``load_workload`` reads a seed file) starts the
    distribution as if those pods had been seen.
    """

    def __init__(self, default: str, workload_seed: Mapping[Shape, float] | None = None) -> None:
        self.default = default
        self.workload = WorkloadDistribution()
        if workload_seed:
            self.workload.seed(workload_seed, observations=sum(workload_seed.values()))
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
