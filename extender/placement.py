"""Which placement policy decides for a pod, and the workload the learning policies learn from."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping

from gpushare.contract import PodInfo, PodRequest, RequestError, parse_request
from gpushare.model import Node
from gpushare.policies import Candidate, Policy, make_policy
from gpushare.policies.workload import Shape, WorkloadDistribution

log = logging.getLogger(__name__)

# How many pod UIDs to remember as already observed, until they are bound; older ones may be observed again,
# which only nudges the workload statistics.
OBSERVED_PODS = 100_000


# Pods whose parsed request is remembered: kube-scheduler asks filter and prioritize about the same pod
# within a second or so, and a cluster rarely has more pods pending at once.
REMEMBERED_REQUESTS = 10_000


class RequestCache:
    """Each pod's request parsed once per UID and resourceVersion, shared by filter and prioritize.

    A pod changes its resourceVersion whenever its spec or annotations change, so a remembered request is
    always the pod's current one. Failures are remembered too: a malformed pod is explained, not re-parsed.
    """

    def __init__(self, size: int = REMEMBERED_REQUESTS) -> None:
        self._size = size
        self._parsed: OrderedDict[tuple[str, str], PodRequest | RequestError] = OrderedDict()
        self._lock = threading.Lock()

    def request(self, pod: PodInfo) -> PodRequest:
        """The pod's request; ``RequestError`` with the user's sentence if it cannot be read."""
        if not pod.uid or not pod.resource_version:
            return parse_request(pod)  # a pod that is not from the API server: nothing identifies its version
        key = (pod.uid, pod.resource_version)
        with self._lock:
            known = self._parsed.get(key)
        if known is None:
            try:
                known = parse_request(pod)
            except RequestError as exc:
                known = exc
            with self._lock:
                self._parsed[key] = known
                while len(self._parsed) > self._size:
                    self._parsed.popitem(last=False)
        if isinstance(known, RequestError):
            raise known
        return known


class PolicyBook:
    """One instance per policy name, all sharing one workload distribution.

    Every pod the extender is asked about feeds the workload once, whichever policy places it: a learning
    policy chosen by a few pods must still know what the rest of the cluster asks for. ``workload_seed``
    (shape -> weight, weights counted as pods, as ``load_workload`` reads a seed file) starts the
    distribution as if those pods had been seen.
    """

    def __init__(self, default: str, workload_seed: Mapping[Shape, float] | None = None) -> None:
        self.default = default
        default_policy = make_policy(default)
        # The default policy builds the distribution it learns from as the trace replay builds it (fgd-scarcity's
        # target counts every shape, fgd's the most frequent 95%), so the extender runs what the replay measured;
        # policies that pods name share it.
        learned = getattr(default_policy, "workload", None)
        self.workload = learned if isinstance(learned, WorkloadDistribution) else WorkloadDistribution()
        if workload_seed:
            self.workload.seed(workload_seed, observations=sum(workload_seed.values()))
        self._policies: dict[str, Policy] = {default: default_policy}
        self._observed: OrderedDict[str, None] = OrderedDict()
        self._failures: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    @property
    def default_policy(self) -> Policy:
        return self._policies[self.default]

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

    def evaluate(self, policy: Policy, node: Node, request: PodRequest) -> Candidate | None:
        """``policy.evaluate``, with a failure inside the policy counted as "does not fit" on that node.

        A policy is pure arithmetic on the node and the learned workload; should some state still break it,
        one node loses this pod rather than every pod's prioritize and bind answering 500. Each kind of failure
        is logged once per policy, so a failure on every node of every pod cannot flood the log.
        """
        try:
            return policy.evaluate(node, request)
        except Exception as exc:
            kind = (policy.name, type(exc).__name__)
            with self._lock:
                first = kind not in self._failures
                self._failures.add(kind)
            if first:
                log.exception("placement policy failed on a node; the node is scored as not fitting, and further "
                              "failures of this kind are not logged", extra={"policy": policy.name,
                                                                              "node": node.name})
            return None

    def chooser(self, policy: Policy, request: PodRequest) -> Callable[[Node], tuple[int, ...] | None]:
        """The GPUs ``policy`` picks for ``request`` on a node (``None`` where it does not fit): what
        ``ClusterCache.reserve`` asks under the node's lock."""
        def choose(node: Node) -> tuple[int, ...] | None:
            candidate = self.evaluate(policy, node, request)
            return None if candidate is None else candidate.gpus
        return choose

    def observe_once(self, uid: str, request: PodRequest) -> None:
        """Count the pod in the workload the first time the extender sees it.

        Callers count only requests that were read without error and fit some node of the cluster (at least
        on the empty node), so the workload stays within the shapes the cluster can run.
        """
        with self._lock:
            if uid in self._observed:
                return
            self._observed[uid] = None
            if len(self._observed) > OBSERVED_PODS:
                self._observed.popitem(last=False)
            self.workload.observe(Shape.of(request))

    def forget(self, uid: str) -> None:
        """Forget that the pod was observed, once it is bound: kube-scheduler filters a bound pod no more, and
        60,000 pods remembered cost 10 MB."""
        with self._lock:
            self._observed.pop(uid, None)
