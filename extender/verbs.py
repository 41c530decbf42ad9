"""filter and prioritize: the cache and the policies answering kube-scheduler's questions."""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from itertools import chain, filterfalse
from typing import Any, cast, overload

from extender.gang import Gangs
from extender.placement import PolicyBook, RequestCache
from extender.wire import ExtenderArgs, check_node_names, filter_result
from gpushare.cache.fitindex import FilterOutcome, shape_key
from gpushare.cache.state import Bracket, Carry, ClusterCache, ReservationError
from gpushare.contract import PodRequest
from gpushare.model import Node
from gpushare.policies import Policy, best_states, extender_scores
from gpushare.policies.base import (
    MAX_EXTENDER_SCORE,
    ClusterAware,
    classes_shares,
    follows_cluster,
    follows_inventory,
    policy_version,
    reprices,
)

# How long filter holds the GPUs it chose for a pod (``Verbs._chosen``) if no bind takes them over: kube-scheduler's
# binding cycle reaches the extender's bind within milliseconds, unless a PreBind step such as volume binding keeps
# it longer (the race a hold closes then returns, for that pod only); a pod abandoned after filter holds its GPUs no
# longer than this.
FILTER_HOLD_S = 10.0


@dataclass(frozen=True, slots=True)
class Filtered:
    """filter's answer (an ExtenderFilterResult), and the hold to make once kube-scheduler has it: holding the GPUs
    filter chose (``Verbs._chosen``) means one more evaluation of the node and a reservation, 0.1-0.15 ms a pod in
    process, which kube-scheduler's serial cycle need not wait for. ``None``: nothing to hold."""

    answer: dict[str, Any]
    hold: Callable[[], None] | None = None


class Verbs:
    def __init__(self, cache: ClusterCache, book: PolicyBook, requests: RequestCache, gangs: Gangs,
                 choose_in_filter: bool = True) -> None:
        self.cache = cache
        self.book = book
        self.requests = requests
        self.gangs = gangs
        self.choose_in_filter = choose_in_filter
        # Per policy that follows the cluster's free capacity (by name): the policy, and how far it has read the
        # cache's log of changes.
        self._followers: dict[str, tuple[ClusterAware, int]] = {}
        self._follow_lock = threading.Lock()

    @overload
    def filter(self, args: ExtenderArgs) -> Filtered: ...

    @overload
    def filter(self, args: ExtenderArgs, max_reads: int) -> Filtered | None: ...

    def filter(self, args: ExtenderArgs, max_reads: int | None = None) -> Filtered | None:
        """ExtenderFilterResult; with ``choose_in_filter``, only the policy's favourite of the nodes a GPU pod fits
        passes, and the GPUs the policy picks there are to be held (``Filtered.hold``) once the answer is out. With
        ``max_reads``, ``None`` when choosing it needs more nodes scored afresh than that (as ``prioritize``); asking
        again without it gives the answer (what was learned from the pod is learned once)."""
        names = args.names
        try:
            request = self.cache.resolve(self.requests.request(args.pod))
            policy = self.book.for_request(request)  # an unknown policy name is the pod's error, before anything counts
        except ValueError as exc:  # a RequestError, or a policy the registry does not have
            check_node_names(self.cache.unknown(names))
            return Filtered(filter_result(args, None, {}, {}, str(exc)))
        if not request.gpu_count:
            check_node_names(self.cache.unknown(names))
            # kube-scheduler has already checked CPU and memory; only GPU requests need the extender's view. Nor
            # does the extender choose: the cache may not know every node such a pod can run on (nodes without
            # GPUs), and prioritize weighs its preference among kube-scheduler's own.
            self.book.observe_once(args.pod.uid or args.pod.key, request)
            return Filtered(filter_result(args, names, {}, {}))
        try:
            gang = self.gangs.filter(args.pod, request, names)
        except ValueError as exc:  # a gang's field that cannot be read: the pod's error, like its request's
            check_node_names(self.cache.unknown(names))
            return Filtered(filter_result(args, None, {}, {}, str(exc)))
        holding = gang is None and self.choose_in_filter
        if holding:  # what an earlier filter of the pod chose is void now, and must not crowd it out of that node
            self.cache.drop_filter_hold(args.pod.key)
        # Choosing in filter, a pod that some node passes gets one node and nothing else: kube-scheduler reads the
        # reasons of the nodes that fail only when none passes, and wording them cost a fifth of the filter.
        outcome = gang if gang is not None else self.cache.filter(names, request, args.pod.uid,
                                                                  explain=not self.choose_in_filter)
        # Every node the cache does not know fails, so only those names can be misspelt: hundreds of names pass
        # for each pod, and looking each up once more cost as much as the filter itself.
        unknown = self.cache.unknown(chain(outcome.failed, outcome.left_out))
        check_node_names(unknown)
        # Every pod kube-scheduler asks about is demand, whether or not its window holds a node that could run it:
        # when every node of a GPU model is full, kube-scheduler sends none of them, and the pods that need that
        # model are the demand fgd-scarcity prices it by. The trace replay learns the same pods.
        self.book.observe_once(args.pod.uid or args.pod.key, request)
        return self._chosen(args, policy, request, outcome, max_reads, holding)

    def _chosen(self, args: ExtenderArgs, policy: Policy, request: PodRequest, outcome: FilterOutcome,
                max_reads: int | None, holding: bool) -> Filtered | None:
        """The filter's answer, passing only the favourite of ``passed`` when the extender chooses in filter, and
        with ``holding`` the hold of the GPUs the policy picks there for the pod until its bind (``FILTER_HOLD_S``).

        kube-scheduler skips prioritize when one node passed, so a GPU pod costs one call before its bind
        instead of two, and the node bound is the policy's choice, whatever kube-scheduler's own scores say.
        The nodes left out are neither failed nor unresolvable: the pod has a node, so nothing reports them.

        kube-scheduler binds in the background and sends the next pod's filter at once, often before this pod's
        bind arrives (whose reservation the next filter would otherwise be the first to see): unheld, the node
        looked as free as before, the packing policies chose it again, and one of the two binds failed for want of
        room, its pod waiting out a backoff (12 of 1,200 pods at 200 nodes, 8 of 300 at 60). The hold is made once
        the answer is written and before the extender reads another request (extender/app.py), which kube-scheduler
        sends only once it has this answer.
        """
        passed = outcome.passed
        if self.choose_in_filter and len(passed) > 1:
            scoring = self._scoring(policy, request, max_reads, all_fit=True)
            if scoring is None:
                return None
            key, score, carry, bracket = scoring
            evaluated = self.cache.evaluate_states(passed, key, score, max_reads, outcome.passed_states, carry,
                                                   outcome.passed_firsts, bracket, best_only=True)
            if evaluated is None:
                return None
            states, scores = evaluated
            # The policy may fail on a node that fits (logged there): the favourite is among the others.
            best = best_states(scores)
            if best:
                passed = [self.cache.favourite(passed, states, best, outcome.passed_counts)]
        answer = filter_result(args, passed, outcome.failed, outcome.unresolvable)
        if not holding or len(passed) != 1:
            return Filtered(answer)
        node, pod_key, uid = passed[0], args.pod.key, args.pod.uid

        def hold() -> None:
            # Should the node have changed meanwhile, the bind decides afresh, as without a hold, and says why.
            with contextlib.suppress(ReservationError):
                self.cache.reserve(node, pod_key, uid, request, self.book.chooser(policy, request),
                                   held_until=time.monotonic() + FILTER_HOLD_S)
        return Filtered(answer, hold)

    def _follow(self, name: str, policy: ClusterAware, max_reads: int | None) -> bool:
        """Show a policy that weighs what the cluster has left the nodes changed since it last looked; with
        ``max_reads``, ``False`` instead, reading nothing, when more nodes than that changed (or the log of
        changes no longer reaches back: every node must be read, as at the first prioritize)."""
        with self._follow_lock:
            _, read_to = self._followers.get(name, (policy, 0))
            position, names = self.cache.changes(read_to)
            if max_reads is not None and (names is None or len(names) > max_reads):
                return False
            if names is None:
                names = self.cache.node_names()
            if names:  # else the policy has nothing to read, and nothing to reprice
                nodes = self.cache.snapshot(names)
                known = {n.name for n in nodes}
                policy.observe_nodes(nodes, [n for n in names if n not in known])
            self._followers[name] = (policy, position)
            return True

    def catch_up(self) -> None:
        """Show each policy that follows the cluster what changed since it last looked, and let it reprice.

        Bind calls this once its reservation is made, while its own call to the API server is still to come:
        otherwise the next pod's filter would read the change, on kube-scheduler's serial path (a fifth of a
        filter at 5,000 nodes). The policy sees the same nodes either way, so it decides the same.
        """
        with self._follow_lock:
            followers = [(name, policy) for name, (policy, _) in self._followers.items()]
        for name, policy in followers:
            self._follow(name, policy, None)
            policy_version(policy)

    def show_cluster(self) -> None:
        """Show the default policy the whole cluster, as the first GPU pod's filter would otherwise do on
        kube-scheduler's serial path: its GPU inventory and, for a policy that weighs what the cluster has left, a
        copy of every node (54-83 ms in process at 5,000 nodes). For when the first list is in, before the extender
        is ready; later filters read only the nodes changed since."""
        self._show(self.book.default_policy, None)

    def _show(self, policy: Policy, max_reads: int | None) -> bool:
        """Show ``policy`` what it follows of the cluster; ``False`` when that is more than ``max_reads`` nodes
        (see ``_follow``)."""
        name = policy.name  # the guards below narrow ``policy`` to protocols, which have no name
        if follows_inventory(policy):
            policy.observe_inventory(self.cache.gpu_capacity())
        return not follows_cluster(policy) or self._follow(name, policy, max_reads)

    @overload
    def prioritize(self, args: ExtenderArgs) -> dict[int, list[str]]: ...

    @overload
    def prioritize(self, args: ExtenderArgs, max_reads: int) -> dict[int, list[str]] | None: ...

    def prioritize(self, args: ExtenderArgs, max_reads: int | None = None) -> dict[int, list[str]] | None:
        """Each score with the names that get it; with ``max_reads``, ``None`` when more nodes than that must be
        evaluated afresh (see ``ClusterCache.evaluate_memoised``) or copied for the policy to follow."""
        names = args.names
        try:
            wanted = self.cache.resolve(self.requests.request(args.pod))
            policy = self.book.for_request(wanted)
        except ValueError:  # filter has already told kube-scheduler why
            check_node_names(self.cache.unknown(names))
            return {0: names}

        planned = self.gangs.planned_node(args.pod)
        if planned is not None:  # filter passed only this node; should kube-scheduler send more, it goes first
            check_node_names(self.cache.unknown(names))
            return {0: [name for name in names if name != planned],
                    MAX_EXTENDER_SCORE: [planned] if planned in names else []}

        scoring = self._scoring(policy, wanted, max_reads)
        if scoring is None:
            return None
        key, score, carry, bracket = scoring
        scores = self.cache.evaluate_memoised(names, key, score, max_reads, carry=carry, bracket=bracket)
        if scores is None:
            return None
        named = dict(zip(names, scores, strict=True))
        fitting = cast(dict[str, float], named if None not in scores else
                       {n: s for n, s in named.items() if s is not None})
        if len(fitting) < len(names):
            # Only a name that scores nothing can be no node of the cache, and only those need their spelling checked.
            check_node_names(self.cache.unknown(names))
        ranked = extender_scores(fitting, self.cache.tie_seed)
        if len(fitting) < len(names):
            ranked.setdefault(0, []).extend(filterfalse(fitting.__contains__, names))
        return ranked

    def _scoring(self, policy: Policy, wanted: PodRequest, max_reads: int | None, all_fit: bool = False
                 ) -> tuple[Hashable, Callable[[Node], float | None], Carry | None, Bracket] | None:
        """The key under which the cache remembers the nodes' raw scores with ``policy`` (the pod's), the score of
        one node (``None`` where the pod does not fit), how scores carry over from the policy's earlier versions
        (for a policy that reprices) and from requests that differ only in CPU, once the policy has seen what
        changed in the cluster; with
        ``max_reads``, ``None`` instead when more nodes than that changed and must be copied for the policy to
        follow. ``all_fit``: the pod fits every node to be scored (a filter just said so)."""
        policy_name = policy.name
        if not self._show(policy, max_reads):
            return None

        if all_fit and wanted.memory_mib:
            # A policy reads the pod's memory request only to tell whether it fits (``Policy.evaluate``), and these
            # nodes fit: scored without it, pods that differ only in memory share their scores (the openb trace's
            # 126 shapes are 81 without memory), so fewer are scored afresh each time the policy learns.
            wanted = replace(wanted, memory_mib=0)

        def score(node: Node) -> float | None:
            candidate = self.book.evaluate(policy, node, wanted)
            # A score that is no finite number cannot be ranked against the others: the node does not fit.
            return None if candidate is None or not math.isfinite(candidate.score) else candidate.score

        # A node's score changes only with its state, the pod's shape and what the policy has learned.
        shape = shape_key(wanted)
        family, version = (policy.name, shape), policy_version(policy)
        carry = Carry(family, version, policy.unchanged_since) if reprices(policy) else None
        # Pods that each ask for a CPU of their own (teams pick their own) would otherwise have every node state
        # scored afresh for each: a score never rises with the CPU asked (``Policy.evaluate``).
        if classes_shares(policy) and wanted.gpu_count == 1 and not wanted.exclusive:
            # And pods that each ask for a share of their own (memory in MiB) from those of the same class.
            classed = (policy.share_class(wanted.per_gpu), *shape[1:-1])
            bracket = Bracket(((policy_name, classed), version), wanted.cpu_milli, wanted.per_gpu)
        else:
            bracket = Bracket(((policy_name, shape[:-1]), version), wanted.cpu_milli, 0)
        return (family, version), score, carry, bracket
