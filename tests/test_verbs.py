"""filter and prioritize on their own, over a cache fed by hand: what they read, and when."""

from __future__ import annotations

import time
from contextlib import suppress
from dataclasses import replace
from typing import Any

import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kubernetes import client
from prometheus_client import CollectorRegistry
from test_cache import gpu_pod, node_info
from test_extender_harness import pod_body

from extender.app import INLINE_SCORE_READS
from extender.gang import Gangs
from extender.placement import PolicyBook, RequestCache
from extender.verbs import FILTER_HOLD_S, Verbs
from extender.wire import ExtenderArgs, parse_extender_args
from gpushare.cache.gangs import GangIndex
from gpushare.cache.state import ClusterCache, ReservationError
from gpushare.contract import ANN_GPU_MODEL, MemoryUnit, PodRequest, parse_request
from gpushare.kube.api import PodGroups
from gpushare.policies import choose_node, policy_names
from gpushare.policies.workload import Shape

NODES = [f"node-{i:02d}" for i in range(20)]


def verbs_over(cache: ClusterCache, policy: str, workload: dict[Shape, float] | None = None
               ) -> tuple[Verbs, PolicyBook]:
    book = PolicyBook(policy, workload)
    requests = RequestCache()
    # No pod here names a gang, so the PodGroups are never read.
    gangs = Gangs(cache, GangIndex(), requests, book, PodGroups(client.ApiClient()), lambda *_: None,
                  CollectorRegistry())
    return Verbs(cache, book, requests, gangs), book


def filter_args(name: str, names: list[str], gpu_mem: int = 4) -> ExtenderArgs:
    pod: dict[str, Any] = pod_body(name, gpu_mem=gpu_mem)
    pod["metadata"] |= {"uid": f"uid-{name}", "resourceVersion": "1"}
    return parse_extender_args(orjson.dumps({"Pod": pod, "NodeNames": names}))


def answered(verbs: Verbs, args: ExtenderArgs) -> dict[str, Any]:
    """filter's answer, the GPUs it chose held as the extender holds them once the answer is written."""
    filtered = verbs.filter(args)
    if filtered.hold is not None:
        filtered.hold()
    return filtered.answer


def test_a_binds_catch_up_leaves_the_next_filter_nothing_to_read() -> None:
    """Bind shows the policies that follow the cluster its reservation (``Verbs.catch_up``) before its Binding,
    so that the next pod's filter, on kube-scheduler's serial path, finds nothing changed to read: asked to read
    nothing afresh, it answers; without the catch-up it cannot, and it answers the same once it has read."""
    cache = ClusterCache()
    cache.replace_nodes([node_info(name, [16384, 16384]) for name in NODES])
    verbs, _ = verbs_over(cache, "fgd-scarcity")
    first = filter_args("first", NODES[:10])
    chosen = answered(verbs, first)["NodeNames"]
    assert len(chosen) == 1 and chosen[0] in NODES[:10]
    # Filter held the GPUs it chose, and the bind takes them over as its reservation.
    assert cache.take_filter_hold(first.pod.key, first.pod.uid, chosen[0], cache.resolve(parse_request(first.pod)))
    second = filter_args("second", NODES[10:])  # the empty nodes the first filter scored
    assert verbs.filter(second, 0) is None, "the reservation is still to be read"
    verbs.catch_up()
    filtered = verbs.filter(second, 0)
    assert filtered is not None and filtered.answer == verbs.filter(second).answer
    answer = filtered.answer
    assert len(answer["NodeNames"]) == 1 and answer["NodeNames"][0] in NODES[10:]


def test_a_policy_shown_the_cluster_at_start_leaves_the_first_filter_only_its_window_to_score() -> None:
    """The extender shows the default policy every node before it is ready (``Verbs.show_cluster``), so that the
    first GPU pod's filter, on kube-scheduler's serial path, does not copy the whole cluster for it: with fewer
    reads allowed than the cluster has nodes (but more than its window's one state), it answers only once shown."""
    cache = ClusterCache()
    cache.replace_nodes([node_info(name, [16384, 16384]) for name in NODES])
    reads = len(NODES) // 2
    verbs, _ = verbs_over(cache, "fgd-scarcity")
    assert verbs.filter(filter_args("first", NODES[:10]), reads) is None, "every node is still to be copied"
    shown, _ = verbs_over(cache, "fgd-scarcity")
    shown.show_cluster()
    filtered = shown.filter(filter_args("first", NODES[:10]), reads)
    assert filtered is not None and filtered.answer == verbs.filter(filter_args("first", NODES[:10])).answer


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
    filtered = verbs.filter(args, INLINE_SCORE_READS)
    assert filtered is not None and filtered.answer == verbs.filter(args).answer
    assert len(filtered.answer["NodeNames"]) == 1 and filtered.answer["NodeNames"][0] in names


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
        answer = answered(verbs, args)
        assert answer["NodeNames"] == [] and sorted(answer["FailedAndUnresolvableNodes"]) == others
        assert Shape.of(parse_request(args.pod)) in book.workload.histogram()


def filter_as_fresh_scores_would(cache: ClusterCache, verbs: Verbs, book: PolicyBook, names: list[str], name: str,
                                 units: int, cpu_milli: int, place: bool) -> None:
    """Filter a pod of ``units`` of GPU memory and ``cpu_milli`` over ``names``: it must choose what the pod's policy
    chooses scoring every node afresh. With ``place``, the bind then takes over what filter held there; without,
    the hold is given back, as when it lapses."""
    body: dict[str, Any] = pod_body(name, gpu_mem=units, cpu=f"{cpu_milli}m")
    body["metadata"] |= {"uid": f"uid-{name}", "resourceVersion": "1"}
    args = parse_extender_args(orjson.dumps({"Pod": body, "NodeNames": names}))
    before = cache.snapshot(names)
    chosen = answered(verbs, args)["NodeNames"]
    request = cache.resolve(parse_request(args.pod))
    pod_policy = book.for_request(request)
    fresh = choose_node(before, replace(request, memory_mib=0), pod_policy, cache.tie_seed)
    assert chosen == ([] if fresh is None else [fresh[0].name]), (name, units, cpu_milli)
    if place and chosen:
        taken = cache.take_filter_hold(args.pod.key, args.pod.uid, chosen[0], request)
        assert taken is not None and fresh is not None and taken.placement.gpu_indices == fresh[1].gpus
        verbs.catch_up()
    else:
        cache.drop_filter_hold(args.pod.key)


@settings(max_examples=40, deadline=None)
@given(cores=st.lists(st.sampled_from(["4", "8", "16", "32"]), min_size=8, max_size=8),
       bound=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 1), st.integers(1, 12),
                                st.sampled_from(["0", "2", "6"])), max_size=12),
       pods=st.lists(st.tuples(st.sampled_from([2, 4, 4, 4, 12]), st.integers(0, 24), st.booleans()), min_size=2,
                     max_size=30),
       policy=st.sampled_from(policy_names()))
def test_filters_that_answer_from_other_cpu_requests_choose_the_node_fresh_scores_choose(
        cores: list[str], bound: list[tuple[int, int, int, str]], pods: list[tuple[int, int, bool]],
        policy: str) -> None:
    """Pods that differ only in the CPU they ask for meet node states the filter already scored for another CPU
    request: it answers from those scores where they settle the score (``Bracket``) and leaves out states that
    cannot reach the best score known. Its choice must be the one the policy makes scoring every node afresh."""
    cache = ClusterCache()
    names = [f"node-{i}" for i in range(len(cores))]
    cache.replace_nodes([node_info(name, [16384, 16384], cpu=count) for name, count in zip(names, cores, strict=True)])
    for i, (index, gpu, units, cpu) in enumerate(bound):
        cache.upsert_pod(gpu_pod(f"bound-{i}", units, node=names[index], gpus=(gpu,), phase="Running", cpu=cpu))
    # A learned workload that a few more pods do not move: the scores of one shape stay comparable across pods.
    verbs, book = verbs_over(cache, policy, {Shape(1, 4, 2000): 3.0, Shape(1, 12, 8000): 1.0, Shape(2, 16, 16000): 0.5})
    for i, (units, halves, place) in enumerate(pods):
        filter_as_fresh_scores_would(cache, verbs, book, names, f"pod-{i}", units, halves * 500, place)


@settings(max_examples=40, deadline=None)
@given(cores=st.lists(st.sampled_from(["4", "8", "16", "32"]), min_size=8, max_size=8),
       bound=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 1), st.sampled_from([4300, 4340, 12300, 12340]),
                                st.integers(0, 8)), max_size=12),
       pods=st.lists(st.tuples(st.sampled_from([1000, 4000, 4000, 12000]), st.integers(0, 99), st.integers(0, 8),
                               st.booleans()), min_size=2, max_size=40),
       policy=st.sampled_from(policy_names()))
@example(cores=["4", "4", "16", "4", "4", "4", "16", "16"],
         bound=[(0, 0, 4300, 0), (0, 0, 4300, 0), (0, 0, 4300, 1), (2, 0, 4340, 0)],
         pods=[(1000, 0, 0, False)] * 10 + [(1000, 0, 0, True), (12000, 0, 0, False)] + [(1000, 0, 0, False)] * 12
         + [(4000, 0, 1, True), (4000, 0, 4, True), (4000, 53, 1, True), (4000, 60, 0, False), (4000, 0, 1, False)],
         policy="fgd-scarcity")  # a bracket that took requests of other shares for bounds settled a score wrongly
def test_filters_that_answer_from_other_shares_of_a_class_choose_the_node_fresh_scores_choose(
        cores: list[str], bound: list[tuple[int, int, int, int]], pods: list[tuple[int, int, int, bool]],
        policy: str) -> None:
    """Pods that ask GPU memory in MiB, each its own amount, meet node states the filter already scored for other
    shares of the same class (two significant digits) and other CPU requests: it answers from those scores where
    they settle the score (``Bracket``). Its choice must be the one the policy makes scoring every node afresh."""
    cache = ClusterCache(MemoryUnit.MiB)
    names = [f"node-{i}" for i in range(len(cores))]
    cache.replace_nodes([node_info(name, [16384, 16384], cpu=count) for name, count in zip(names, cores, strict=True)])
    verbs, book = verbs_over(cache, policy, {Shape(1, 4000, 2000): 3.0, Shape(1, 12000, 8000): 1.0,
                                             Shape(2, 16384, 16000): 0.5})
    # GPUs with room inside a class: 12,084, 12,044, 4,084 or 4,044 units free.
    for i, (index, gpu, units, halves) in enumerate(bound):
        placed = PodRequest(per_gpu=units, gpu_count=1, cpu_milli=halves * 500)
        with suppress(ReservationError):
            cache.reserve(names[index], f"default/bound-{i}", f"uid-bound-{i}", placed, lambda _, gpu=gpu: (gpu,))
    for i, (base, offset, halves, place) in enumerate(pods):
        units = base + offset * (base // 100) // 100  # within the class of ``base``
        filter_as_fresh_scores_would(cache, verbs, book, names, f"pod-{i}", units, halves * 500, place)


def test_filter_holds_the_gpus_it_chose_until_the_bind_takes_them_over() -> None:
    """kube-scheduler sends the next pod's filter before this pod's bind arrives: the node filter chose must not look
    free to it, or the packing policy chooses it again and one of the two binds fails for want of room."""
    cache = ClusterCache()
    cache.replace_nodes([node_info(name, [16384]) for name in NODES[:2]])
    verbs, _ = verbs_over(cache, "binpack")
    first, second = filter_args("first", NODES[:2], gpu_mem=16), filter_args("second", NODES[:2], gpu_mem=16)
    # The hold is made once the answer is out, off kube-scheduler's serial cycle (extender/app.py).
    filtered = verbs.filter(first)
    [chosen] = filtered.answer["NodeNames"]
    assert filtered.hold is not None and cache.reservations() == 0
    filtered.hold()
    [other] = answered(verbs, second)["NodeNames"]
    assert other != chosen, "the second filter saw the first one's node as free"
    assert answered(verbs, filter_args("third", NODES[:2], gpu_mem=16))["NodeNames"] == []
    assert cache.reservations() == 2
    # Filtered again (its bind failed elsewhere, or it went back to the queue), a pod is offered its own node again.
    assert answered(verbs, first)["NodeNames"] == [chosen] and cache.reservations() == 2
    request = cache.resolve(parse_request(first.pod))
    taken = cache.take_filter_hold(first.pod.key, first.pod.uid, chosen, request)
    assert taken is not None and taken.placement.gpu_indices == (0,) and not taken.held_until
    assert cache.take_filter_hold(first.pod.key, first.pod.uid, chosen, request) is None, "taken once"
    # A bind to another node than filter held gives the hold back.
    assert cache.take_filter_hold(second.pod.key, second.pod.uid, chosen, request) is None
    assert cache.reservations() == 1


def test_a_hold_no_bind_takes_over_lapses() -> None:
    cache = ClusterCache()
    cache.replace_nodes([node_info(NODES[0], [16384])])
    verbs, _ = verbs_over(cache, "binpack")
    started = time.monotonic()
    assert answered(verbs, filter_args("first", NODES[:1], gpu_mem=16))["NodeNames"] == [NODES[0]]
    assert answered(verbs, filter_args("second", NODES[:1], gpu_mem=16))["NodeNames"] == []
    assert cache.release_lapsed_holds(started) == 0
    assert cache.release_lapsed_holds(started + FILTER_HOLD_S + 1) == 1
    assert answered(verbs, filter_args("second", NODES[:1], gpu_mem=16))["NodeNames"] == [NODES[0]]


def test_a_hold_gives_way_to_the_pod_bound_elsewhere_and_to_its_deletion() -> None:
    """With several replicas the leader binds the pod that a follower's filter held for: the watch's word counts."""
    cache = ClusterCache()
    cache.replace_nodes([node_info(name, [16384]) for name in NODES[:2]])
    verbs, _ = verbs_over(cache, "binpack")
    first = filter_args("first", NODES[:2], gpu_mem=16)
    [chosen] = answered(verbs, first)["NodeNames"]
    elsewhere = NODES[1] if chosen == NODES[0] else NODES[0]
    cache.upsert_pod(gpu_pod("first", 16, node=elsewhere, gpus=(0,)))
    assert cache.reservations() == 0
    assert answered(verbs, filter_args("second", NODES[:2], gpu_mem=16))["NodeNames"] == [chosen]
    cache.delete_pod(gpu_pod("second", 16))
    assert cache.reservations() == 0


def test_a_bind_does_not_take_over_a_hold_that_a_pod_the_watch_added_overcommits() -> None:
    cache = ClusterCache()
    cache.replace_nodes([node_info(NODES[0], [16384])])
    verbs, _ = verbs_over(cache, "binpack")
    first = filter_args("first", NODES[:1], gpu_mem=16)
    assert answered(verbs, first)["NodeNames"] == [NODES[0]]
    cache.upsert_pod(gpu_pod("rival", 16, node=NODES[0], gpus=(0,)))  # placed by another scheduler meanwhile
    request = cache.resolve(parse_request(first.pod))
    assert cache.take_filter_hold(first.pod.key, first.pod.uid, NODES[0], request) is None
    assert cache.reservations() == 0
