"""filter and prioritize on their own, over a cache fed by hand: what they read, and when."""

from __future__ import annotations

from typing import Any

import orjson
from kubernetes import client
from prometheus_client import CollectorRegistry
from test_cache import node_info
from test_extender_harness import pod_body

from extender.app import INLINE_SCORE_READS
from extender.gang import Gangs
from extender.placement import PolicyBook, RequestCache
from extender.verbs import Verbs
from extender.wire import ExtenderArgs, parse_extender_args
from gpushare.cache.gangs import GangIndex
from gpushare.cache.state import ClusterCache
from gpushare.contract import ANN_GPU_MODEL, parse_request
from gpushare.kube.api import PodGroups
from gpushare.model import Node
from gpushare.policies.workload import Shape

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


def test_a_window_of_six_dozen_node_states_is_answered_on_the_event_loop() -> None:
    """On a fleet of many node shapes (openb's: nine models, 1 to 8 GPUs a node) a filter window holds a dozen
    states or more, each new to the pod's shape, and with every sharing pod its own GPU share up to 70: up to
    ``INLINE_SCORE_READS`` of them are scored on the event loop, where sending the filter to a thread to start over
    would set the p99; past it, the filter goes to a thread."""
    sizes = [8192 + 512 * i for i in range(72)]  # each node its own GPU size: its own state
    names = [f"node-{i:02d}" for i in range(len(sizes))]
    cache = ClusterCache()
    cache.replace_nodes([node_info(name, [size, size]) for name, size in zip(names, sizes, strict=True)])
    verbs, _ = verbs_over(cache, "fgd-scarcity")
    args = filter_args("pod", names)
    assert verbs.filter(args, len(sizes) - 1) is None, "more states than allowed inline go to a thread"
    answer = verbs.filter(args, INLINE_SCORE_READS)
    assert answer is not None and answer == verbs.filter(args)
    assert len(answer["NodeNames"]) == 1 and answer["NodeNames"][0] in names


def test_every_pod_kube_scheduler_asks_about_is_learned_though_its_window_holds_no_node_that_could_run_it() -> None:
    """kube-scheduler sends only the nodes with the CPU, memory and GPU memory free: once every node of a pod's GPU
    model is full, its window holds only nodes of other models, which could never run it. The pod is demand for
    that model all the same, and fgd-scarcity prices the model from the learned demand, so the pod is learned, as
    the trace replay learns it; so is a pod of a model no node has, which the policies weigh as demand nothing can
    serve."""
    cache = ClusterCache()
    cache.replace_nodes([node_info("t4-0", [16384, 16384]),
                         *(node_info(f"g2-{i}", [16384, 16384], models=["G2", "G2"]) for i in range(3))])
    verbs, book = verbs_over(cache, "fgd-scarcity")
    others = ["g2-0", "g2-1", "g2-2"]

    def constrained(name: str, model: str) -> ExtenderArgs:
        pod: dict[str, Any] = pod_body(name, gpu_mem=4, annotations={ANN_GPU_MODEL: model})
        pod["metadata"] |= {"uid": f"uid-{name}", "resourceVersion": "1"}
        return parse_extender_args(orjson.dumps({"Pod": pod, "NodeNames": others}))

    for name, model in (("t4-pod", "Tesla-T4"), ("a100-pod", "A100")):
        args = constrained(name, model)
        answer = verbs.filter(args)
        assert answer["NodeNames"] == [] and sorted(answer["FailedAndUnresolvableNodes"]) == others
        assert Shape.of(parse_request(args.pod)) in book.workload.histogram()
