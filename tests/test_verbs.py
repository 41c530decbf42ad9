"""filter and prioritize on their own, over a cache fed by hand: what they read, and when."""

from __future__ import annotations

from typing import Any

import orjson
from kubernetes import client
from prometheus_client import CollectorRegistry
from test_cache import node_info
from test_extender_harness import pod_body

from extender.gang import Gangs
from extender.placement import PolicyBook, RequestCache
from extender.verbs import Verbs
from extender.wire import ExtenderArgs, parse_extender_args
from gpushare.cache.gangs import GangIndex
from gpushare.cache.state import ClusterCache
from gpushare.contract import parse_request
from gpushare.kube.api import PodGroups
from gpushare.model import Node

NODES = [f"node-{i:02d}" for i in range(20)]


def verbs_over(cache: ClusterCache, policy: str) -> tuple[Verbs, PolicyBook]:
    book = PolicyBook(policy)
    requests = RequestCache()
    # No pod here names a gang, so the PodGroups are never read.
    gangs = Gangs(cache, GangIndex(), requests, book, PodGroups(client.ApiClient()), lambda *_: None,
                  CollectorRegistry())
    return Verbs(cache, book, requests, gangs), book


def filter_args(name: str, names: list[str]) -> ExtenderArgs:
    pod: dict[str, Any] = pod_body(name, gpu_mem=4)
    pod["metadata"] |= {"uid": f"uid-{name}", "resourceVersion": "1"}
    return parse_extender_args(orjson.dumps({"Pod": pod, "NodeNames": names}))


def test_a_binds_catch_up_leaves_the_next_filter_nothing_to_read() -> None:
    """Bind shows the policies that follow the cluster its reservation (``Verbs.catch_up``) before its Binding,
    so that the next pod's filter, on kube-scheduler's serial path, finds nothing changed to read: asked to read
    nothing afresh, it answers; without the catch-up it cannot, and it answers the same once it has read."""
    cache = ClusterCache()
    cache.replace_nodes([node_info(name, [16384, 16384]) for name in NODES])
    verbs, book = verbs_over(cache, "fgd-scarcity")
    first = filter_args("first", NODES[:10])
    chosen = verbs.filter(first)["NodeNames"]
    assert len(chosen) == 1 and chosen[0] in NODES[:10]
    request = parse_request(first.pod)
    policy = book.for_request(request)

    def choose(node: Node) -> tuple[int, ...] | None:
        candidate = book.evaluate(policy, node, request)
        return None if candidate is None else candidate.gpus

    cache.reserve(chosen[0], first.pod.key, first.pod.uid, request, choose)
    second = filter_args("second", NODES[10:])  # the empty nodes the first filter scored
    assert verbs.filter(second, 0) is None, "the reservation is still to be read"
    verbs.catch_up()
    answer = verbs.filter(second, 0)
    assert answer is not None and answer == verbs.filter(second)
    assert len(answer["NodeNames"]) == 1 and answer["NodeNames"][0] in NODES[10:]
