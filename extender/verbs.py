"""filter and prioritize: the cache and the policies answering kube-scheduler's questions."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from extender.placement import PolicyBook
from extender.wire import NODE_NAMES_SHAPE, BadRequest, ExtenderArgs, filter_result
from gpushare.cache import ClusterCache
from gpushare.contract import PodRequest, parse_request, requests_gpu
from gpushare.model import Node
from gpushare.policies import extender_scores


def _check_names(names: Iterable[object]) -> None:
    if not all(type(name) is str for name in names):
        raise BadRequest(NODE_NAMES_SHAPE)


def gpu_request(args: ExtenderArgs) -> PodRequest | None:
    """The pod's GPU request, ``None`` if it asks for no gpushare resource; ``RequestError`` if malformed."""
    if not requests_gpu(args.pod):
        return None
    return parse_request(args.pod)


class Verbs:
    def __init__(self, cache: ClusterCache, book: PolicyBook, tie_seed: int = 0) -> None:
        self.cache = cache
        self.book = book
        self.tie_seed = tie_seed

    def filter(self, args: ExtenderArgs) -> dict[str, Any]:
        try:
            request = gpu_request(args)
            if request is not None:
                self.book.observe_once(args.pod.uid or args.pod.key, request)
        except ValueError as exc:  # a RequestError, or a policy the registry does not have
            return filter_result(args, None, {}, {}, str(exc))
        names = args.names
        if request is None:
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
            request = gpu_request(args)
            policy = None if request is None else self.book.for_request(request)
        except ValueError:  # filter has already told kube-scheduler why
            request = policy = None
        if request is None or policy is None:
            return [{"Host": name, "Score": 0} for name in names]
        wanted = request

        def score(node: Node) -> float | None:
            candidate = policy.evaluate(node, wanted)
            return None if candidate is None else candidate.score

        raw = self.cache.evaluate(names, score)
        scores = extender_scores({n: s for n, s in raw.items() if s is not None}, self.tie_seed)
        return [{"Host": name, "Score": scores.get(name, 0)} for name in names]
