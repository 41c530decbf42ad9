"""Fast, exact replay of ``choose_node`` over a large cluster.

``choose_node`` asks the policy about every node for every pod: 1,213 nodes x 10,500 pods x 40 runs is far
too slow in Python. But ``Policy.evaluate`` is a pure function of the node's resource state and the request,
and the winner among nodes with the same answer is the one with the highest ``node_priority``. So nodes are
grouped by state signature; each group is asked once per request shape and remembers the answer; for each
request shape a heap ranks the groups by (score, best member's priority). Placing a pod changes one node,
which leaves one group (whose best member it was) and joins another; only the joined group is new to the
rankings, and stale heap entries are corrected when they surface. The decisions are exactly those of
``choose_node`` (the tests compare both), as long as the policy's answers depend only on the node's
resources and change only together with the policy's ``version``.

Most answers (four in five on the openb traces) are "does not fit", and whether a pod fits a node is a fact
of the two, not of what the policy has learned (``Policy.evaluate``'s contract). So a version change drops
only the scores and keeps those answers: a learning policy re-scores only the groups the pod can use.

Signatures and request keys are nested tuples, and Python hashes a tuple anew at every lookup: each is
hashed once, when first met, and numbered; the groups, answers and rankings are keyed by those numbers.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from gpushare.contract import PodRequest
from gpushare.model import Node
from gpushare.model import state_signature as signature
from gpushare.policies import Candidate, Policy, node_priority
from gpushare.policies.base import policy_version

Signature = Hashable
RequestKey = Hashable


def request_key(request: PodRequest) -> RequestKey:
    """Everything about a request that ``evaluate`` reads (not the policy override or container names)."""
    return (request.gpu_count, request.per_gpu, request.exclusive, request.compute_percent, request.models,
            request.cpu_milli, request.memory_mib)


@dataclass(slots=True)
class _Group:
    members: list[tuple[int, int]]  # heap of (-priority, node index)
    answers: dict[int, Candidate | None] = field(default_factory=dict)  # by request number
    version: int = 0


@dataclass(slots=True)
class _Ranking:
    version: int
    log_position: int
    heap: list[tuple[float, int, int, int, Candidate]] = field(default_factory=list)  # (..., state number, ...)


class GroupedCluster:
    """The cluster state of a replay, and ``choose_node``'s decision for each pod, computed fast."""

    def __init__(self, nodes: Sequence[Node], policy: Policy, seed: int) -> None:
        self.nodes = list(nodes)
        self.policy = policy
        self.seed = seed
        self.evaluations = 0
        self._priority = [node_priority(n.name, seed) for n in self.nodes]
        self._numbers: dict[Signature, int] = {}
        self._state = [self._number(signature(n)) for n in self.nodes]
        self._groups: dict[int, _Group] = {}
        self._log: list[int] = []
        self._requests: dict[RequestKey, int] = {}
        self._rankings: dict[int, _Ranking] = {}
        self._sequence = 0
        for index in range(len(self.nodes)):
            self._join(index)

    def choose(self, request: PodRequest) -> tuple[int, Candidate] | None:
        """The index of the node ``choose_node`` would pick, with the policy's candidate there."""
        key = self._requests.setdefault(request_key(request), len(self._requests))
        version = policy_version(self.policy)
        ranking = self._rankings.get(key)
        groups = self._groups
        if ranking is None or ranking.version != version:
            ranking = self._rankings[key] = _Ranking(version, len(self._log))
            fresh: Sequence[int] = list(groups)
        else:
            backlog = self._log[ranking.log_position:]
            fresh = list(groups) if len(backlog) > len(groups) else list(dict.fromkeys(backlog))
            ranking.log_position = len(self._log)
        for state in fresh:
            group = groups.get(state)
            if group is None:
                continue
            candidate = self._answer(group, key, request, version)
            if candidate is not None:
                self._push(ranking, candidate, group.members[0][0], state)
        heap = ranking.heap
        while heap:
            _, negative_priority, _, state, candidate = heap[0]
            group = groups.get(state)
            if group is None:
                heapq.heappop(heap)
                continue
            best = group.members[0][0]
            if best == negative_priority:
                return group.members[0][1], candidate
            heapq.heappop(heap)
            if best > negative_priority:
                # The group lost its best member; it ranks by the next one now.
                self._push(ranking, candidate, best, state)
        return None

    def place(self, index: int, pod_key: str, request: PodRequest, gpus: Sequence[int]) -> None:
        """Place the pod on node ``index`` (the best member of its group, as ``choose`` returns)."""
        group = self._groups[self._state[index]]
        if group.members[0][1] != index:
            raise ValueError("The replay places pods only on the node that choose() returned.")
        heapq.heappop(group.members)
        if not group.members:
            del self._groups[self._state[index]]
        self.nodes[index].place(pod_key, request, gpus)
        self._state[index] = self._number(signature(self.nodes[index]))
        self._join(index)

    def _number(self, sig: Signature) -> int:
        return self._numbers.setdefault(sig, len(self._numbers))

    def _join(self, index: int) -> None:
        state = self._state[index]
        entry = (-self._priority[index], index)
        group = self._groups.get(state)
        if group is None:
            self._groups[state] = _Group([entry])
            self._log.append(state)
            return
        heapq.heappush(group.members, entry)
        if group.members[0] == entry:
            self._log.append(state)

    def _answer(self, group: _Group, key: int, request: PodRequest, version: int) -> Candidate | None:
        if group.version != version:
            # Feasibility does not depend on the version: keep the "does not fit" answers.
            group.answers = {k: a for k, a in group.answers.items() if a is None}
            group.version = version
        answers = group.answers
        if key in answers:
            return answers[key]
        self.evaluations += 1
        answer = answers[key] = self.policy.evaluate(self.nodes[group.members[0][1]], request)
        return answer

    def _push(self, ranking: _Ranking, candidate: Candidate, negative_priority: int, state: int) -> None:
        self._sequence += 1
        heapq.heappush(ranking.heap, (-candidate.score, negative_priority, self._sequence, state, candidate))
