"""filter and prioritize: the cache and the policies answering kube-scheduler's questions."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from extender.placement import PolicyBook, RequestCache
from extender.wire import NODE_NAMES_SHAPE, BadRequest, ExtenderArgs, filter_result
from gpushare.cache.state import ClusterCache
from gpushare.model import Node
from gpushare.policies import extender_scores
from gpushare.policies.base import InventoryAware


def _check_names(names: Iterable[object]) -> None:
    if not all(type(name) is str for name in names):
        raise BadRequest(NODE_NAMES_SHAPE)


class Verbs:
    def __init__(self, cache: ClusterCache, book: PolicyBook, requests: RequestCache, tie_seed: int = 0) -> None:
        self.cache = cache
        self.book = book
        self.requests = requests
        self.tie_seed = tie_seed

    def filter(self, args: ExtenderArgs) -> dict[str, Any]:
        try:
            request = self.requests.request(args.pod)
            self.book.observe_once(args.pod.uid or args.pod.key, request)
        except ValueError as exc:  # a RequestError, or a policy the registry does not have
            return filter_result(args, None, {}, {}, str(exc))
        names = args.names
        if not request.gpu_count:
            # kube-scheduler has already checked CPU and memory; only GPU requests need the extender's view.
            _check_names(names)
            return filter_result(args, names, {}, {})
        try:
            outcome = self.cache.filter(names, request)
        except TypeError:
            raise BadRequest(NODE_NAMES_SHAPE) from None
        # Names that passed are cached node names, hence strings; only the rest need a look.
        _check_names(outcome.failed)
        return filter_result(args, outcome.passed, outcome.failed, outcome.unresolvable)

    def prioritize(self, args: ExtenderArgs) -> list[dict[str, Any]]:
        names = args.names
        _check_names(names)
        try:
            wanted = self.requests.request(args.pod)
            policy = self.book.for_request(wanted)
        except ValueError:  # filter has already told kube-scheduler why
            return [{"Host": name, "Score": 0} for name in names]

        if isinstance(policy, InventoryAware):
            policy.observe_inventory(self.cache.gpu_capacity())

        def score(node: Node) -> float | None:
            candidate = policy.evaluate(node, wanted)
            return None if candidate is None else candidate.score

        raw = self.cache.evaluate(names, score)
        scores = extender_scores({n: s for n, s in raw.items() if s is not None}, self.tie_seed)
        return [{"Host": name, "Score": scores.get(name, 0)} for name in names]
