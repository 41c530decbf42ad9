"""The cluster cache on its own: accounting from annotations, reservations, relists, the filter's fast path."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Hashable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.inspect import inspect_nodes
from gpushare.cache.fitindex import NodeSummary, fit_check, read_window, sort_window
from gpushare.cache.state import (
    BRACKET_SWEEP_EVERY,
    BRACKET_TABLES,
    MAX_ANSWER_TABLES,
    MAX_GPU_NUMBERS,
    Bracket,
    Carry,
    ClusterCache,
    ReservationError,
)
from gpushare.contract import (
    ANN_NODE_INVENTORY,
    RESOURCE_GPU_COUNT,
    RESOURCE_GPU_MEM,
    ContainerInfo,
    GPUInventoryEntry,
    MemoryUnit,
    ModelRule,
    NodeInfo,
    PodInfo,
    PodRequest,
    encode_inventory,
    new_assignment,
    parse_request,
)
from gpushare.model import Node, build_node, state_signature
from gpushare.policies import make_policy, node_priority


def node_info(name: str, gpus_mib: list[int], models: list[str] | None = None, cpu: str = "32") -> NodeInfo:
    models = models or ["Tesla-T4"] * len(gpus_mib)
    inventory = encode_inventory(GPUInventoryEntry(index=i, model=m, memory_mib=mib)
                                 for i, (mib, m) in enumerate(zip(gpus_mib, models, strict=True)))
    return NodeInfo(name=name, annotations={ANN_NODE_INVENTORY: inventory},
                    capacity={"cpu": cpu, "memory": "64Gi"}, allocatable={"cpu": cpu, "memory": "64Gi"})


def gpu_pod(name: str, units: int, count: int = 1, node: str | None = None, gpus: tuple[int, ...] = (),
            phase: str = "Pending", uid: str = "", cpu: str = "1") -> PodInfo:
    limits = {RESOURCE_GPU_MEM: str(units)}
    if count > 1:
        limits[RESOURCE_GPU_COUNT] = str(count)
    pod = PodInfo(namespace="default", name=name, uid=uid or f"uid-{name}", node_name=node, phase=phase,
                  containers=(ContainerInfo("main", limits=limits, requests={"cpu": cpu}),))
    if gpus:
        request = parse_request(pod)
        ann = new_assignment(request, gpus, 16, MemoryUnit.GiB, 1).annotations()
        pod = PodInfo(namespace=pod.namespace, name=name, uid=pod.uid, node_name=node, phase=phase,
                      annotations=ann, containers=pod.containers)
    return pod


def used(cache: ClusterCache, node: str) -> list[int]:
    with cache.locked(node) as state:
        assert state is not None
        return [g.used for g in state.gpus]


def binpack(node: Node, request: PodRequest) -> tuple[int, ...] | None:
    candidate = make_policy("binpack").evaluate(node, request)
    return None if candidate is None else candidate.gpus


def test_mixed_models_on_one_node_keep_their_own_memory() -> None:
    cache = ClusterCache(MemoryUnit.GiB)
    cache.upsert_node(node_info("n1", [16160, 32510, 81559], ["Tesla-V100-16GB", "Tesla-V100-32GB", "A100-80GB"]))
    [view] = inspect_nodes(cache, "n1")
    assert [d["totalGPU"] for d in view["devs"]] == [16, 32, 80]
    assert view["totalGPU"] == 128


def test_nodes_without_inventory_split_capacity_by_count() -> None:
    cache = ClusterCache()
    cache.upsert_node(NodeInfo(name="old", capacity={RESOURCE_GPU_MEM: "32", RESOURCE_GPU_COUNT: "2"}))
    [view] = inspect_nodes(cache, "old")
    assert [d["totalGPU"] for d in view["devs"]] == [16, 16]


def test_only_active_pods_count() -> None:
    cache = ClusterCache()
    cache.upsert_node(node_info("n1", [16384, 16384]))
    cache.replace_pods([
        gpu_pod("running", 4, node="n1", gpus=(0,), phase="Running"),
        gpu_pod("done", 8, node="n1", gpus=(1,), phase="Succeeded"),
        gpu_pod("failed", 8, node="n1", gpus=(1,), phase="Failed"),
    ])
    assert used(cache, "n1") == [4, 0]
    terminating = gpu_pod("running", 4, node="n1", gpus=(0,), phase="Running")
    cache.upsert_pod(PodInfo(**{**terminating.__dict__, "deleting": True}))
    assert used(cache, "n1") == [0, 0]


def test_pods_seen_before_their_node_are_counted_when_it_appears() -> None:
    cache = ClusterCache()
    cache.upsert_pod(gpu_pod("early", 6, node="late", gpus=(1,), phase="Running"))
    assert inspect_nodes(cache, "late") == []
    cache.upsert_node(node_info("late", [16384, 16384]))
    assert used(cache, "late") == [0, 6]


def test_inventory_update_keeps_pods() -> None:
    cache = ClusterCache()
    cache.upsert_node(node_info("n1", [16384, 16384]))
    cache.upsert_pod(gpu_pod("a", 6, node="n1", gpus=(1,), phase="Running"))
    cache.upsert_node(node_info("n1", [16384, 32768]))
    [view] = inspect_nodes(cache, "n1")
    assert [(d["totalGPU"], d["usedGPU"]) for d in view["devs"]] == [(16, 0), (32, 6)]
    assert view["devs"][1]["pods"] == [{"name": "a", "namespace": "default", "usedGPU": 6}]


def test_deleted_node_disappears_and_its_pods_return_with_it() -> None:
    cache = ClusterCache()
    cache.upsert_node(node_info("n1", [16384]))
    cache.upsert_pod(gpu_pod("a", 6, node="n1", gpus=(0,), phase="Running"))
    cache.replace_nodes([])
    assert cache.node_names() == []
    assert "n1" in cache.filter(["n1"], parse_request(gpu_pod("b", 1))).failed
    cache.upsert_node(node_info("n1", [16384]))
    assert used(cache, "n1") == [6]


def test_relist_replaces_state() -> None:
    cache = ClusterCache()
    cache.upsert_node(node_info("n1", [16384, 16384]))
    cache.upsert_pod(gpu_pod("gone", 8, node="n1", gpus=(0,), phase="Running"))
    cache.replace_pods([gpu_pod("new", 3, node="n1", gpus=(1,), phase="Running")])
    assert used(cache, "n1") == [0, 3]


def test_reservation_holds_until_the_watch_confirms_it() -> None:
    cache = ClusterCache()
    cache.upsert_node(node_info("n1", [16384, 16384]))
    pod = gpu_pod("p", 10)
    request = parse_request(pod)
    reservation = cache.reserve("n1", pod.key, pod.uid, request, lambda n: binpack(n, request))
    assert used(cache, "n1") == [10, 0]
    assert cache.filter(["n1"], parse_request(gpu_pod("q", 10))).passed == ["n1"]  # GPU 1 still free
    assert cache.filter(["n1"], parse_request(gpu_pod("q", 20, count=2))).failed
    cache.upsert_pod(pod)  # an event from before the bind must not drop the reservation
    assert used(cache, "n1") == [10, 0]
    cache.replace_pods([pod])  # nor a relist that still shows the pod pending
    assert used(cache, "n1") == [10, 0]
    cache.upsert_pod(gpu_pod("p", 10, node="n1", gpus=(0,), phase="Running"))
    assert cache.reservations() == 0
    cache.release(reservation)  # confirmed: releasing is a no-op
    assert used(cache, "n1") == [10, 0]


def test_the_watch_confirming_a_reservation_gives_its_placement_the_pods_uid_and_keeps_the_state() -> None:
    """Preemption names its victims by UID, which a reservation does not hold; a confirmation that shows the pod
    holding something else than was reserved is accounted as the watch shows it."""
    cache = ClusterCache()
    cache.upsert_node(node_info("n1", [16384, 16384]))
    pod = gpu_pod("p", 10)
    request = parse_request(pod)
    cache.reserve("n1", pod.key, pod.uid, request, lambda n: binpack(n, request))
    state = cache._node_states["n1"]
    with cache.locked("n1") as node:
        assert node is not None and node.placements[pod.key].uid == ""
    cache.upsert_pod(gpu_pod("p", 10, node="n1", gpus=(0,), phase="Running"))
    assert cache.reservations() == 0 and cache._node_states["n1"] == state and used(cache, "n1") == [10, 0]
    with cache.locked("n1") as node:
        assert node is not None and node.placements[pod.key].uid == "uid-p"

    other = gpu_pod("q", 4)
    wanted = parse_request(other)
    cache.reserve("n1", other.key, other.uid, wanted, lambda n: binpack(n, wanted))
    assert used(cache, "n1") == [14, 0]
    cache.upsert_pod(gpu_pod("q", 6, node="n1", gpus=(0,), phase="Running"))  # its GPU, with more memory
    assert cache.reservations() == 0 and used(cache, "n1") == [16, 0]
    with cache.locked("n1") as node:
        assert node is not None and node.placements[other.key].uid == "uid-q"


def test_memoised_answers_are_read_once_per_state_and_given_per_state() -> None:
    cache = ClusterCache()
    for name in ("a1", "a2", "a3"):
        cache.upsert_node(node_info(name, [16384]))
    cache.upsert_node(node_info("b", [8192]))
    reads: list[str] = []

    def free(node: Node) -> int:
        reads.append(node.name)
        return node.gpus[0].free

    evaluated = cache.evaluate_states(["a2", "b", "a1", "gone", "a3"], "k", free)
    assert evaluated is not None
    states, answers = evaluated
    assert states == [cache._node_states[n] for n in ("a2", "b", "a1")] + [None, cache._node_states["a3"]]
    assert answers == {states[0]: 16, states[1]: 8, None: None}
    assert reads == ["a2", "b"]  # the first node of each state, in the names' order


def test_states_a_filter_split_are_read_on_the_node_it_kept_for_each_without_pairing_the_names_again() -> None:
    """Filter keeps, per state that passed, its first name (``passed_firsts``); scoring reads a state it has no
    answer for on that node, and takes the states in that order."""
    cache = ClusterCache()
    for name in ("a1", "a2", "a3"):
        cache.upsert_node(node_info(name, [16384]))
    cache.upsert_node(node_info("b", [8192]))
    cache.upsert_node(node_info("small", [2048]))
    out = cache.filter(["a2", "small", "b", "a1", "a3"], parse_request(gpu_pod("p", 4)), explain=False)
    a, b = cache._node_states["a1"], cache._node_states["b"]
    assert out.passed == ["a2", "b", "a1", "a3"] and out.passed_firsts == {a: "a2", b: "b"}
    reads: list[str] = []

    def free(node: Node) -> int:
        reads.append(node.name)
        return node.gpus[0].free

    # Given which node to read per state, that one is read, whatever the names' order says.
    evaluated = cache.evaluate_states(out.passed, "k", free, states=out.passed_states, firsts={b: "b", a: "a3"})
    assert evaluated is not None and reads == ["b", "a3"]
    assert list(evaluated[1].items()) == [(b, 8), (a, 16)]


def test_released_reservation_frees_the_gpu() -> None:
    cache = ClusterCache()
    cache.upsert_node(node_info("n1", [16384]))
    pod = gpu_pod("p", 10)
    request = parse_request(pod)
    reservation = cache.reserve("n1", pod.key, pod.uid, request, lambda n: binpack(n, request))
    with pytest.raises(ReservationError, match="already being bound"):
        cache.reserve("n1", pod.key, pod.uid, request, lambda n: binpack(n, request))
    cache.release(reservation)
    assert used(cache, "n1") == [0]
    assert cache.reservations() == 0


def test_reservation_of_a_deleted_pod_ends_with_it() -> None:
    cache = ClusterCache()
    cache.upsert_node(node_info("n1", [16384]))
    pod = gpu_pod("p", 10)
    request = parse_request(pod)
    cache.reserve("n1", pod.key, pod.uid, request, lambda n: binpack(n, request))
    cache.delete_pod(pod)
    assert used(cache, "n1") == [0]


def test_reserve_refuses_what_does_not_fit() -> None:
    cache = ClusterCache()
    cache.upsert_node(node_info("n1", [16384]))
    request = parse_request(gpu_pod("big", 20))
    with pytest.raises(ReservationError, match=r"no longer fits: node\(s\) have 0 GPU"):
        cache.reserve("n1", "default/big", "u", request, lambda n: binpack(n, request))
    with pytest.raises(ReservationError, match="not in the gpushare extender's cache"):
        cache.reserve("nowhere", "default/big", "u", request, lambda n: binpack(n, request))


def test_concurrent_reservations_never_overcommit() -> None:
    cache = ClusterCache()
    cache.upsert_node(node_info("n1", [16384, 16384]))
    request = parse_request(gpu_pod("p", 3))
    results: list[bool] = []

    def bind(i: int) -> None:
        try:
            cache.reserve("n1", f"default/p{i}", str(i), request, lambda n: binpack(n, request))
            results.append(True)
        except ReservationError:
            results.append(False)

    threads = [threading.Thread(target=bind, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 10  # 5 pods of 3 per 16 GiB GPU
    assert used(cache, "n1") == [15, 15]


def test_filter_sorts_nodes_into_passed_failed_and_unresolvable() -> None:
    cache = ClusterCache()
    cache.upsert_node(node_info("small", [8192]))
    cache.upsert_node(node_info("full", [16384]))
    cache.upsert_node(node_info("free", [16384]))
    cache.upsert_pod(gpu_pod("hog", 16, node="full", gpus=(0,), phase="Running"))
    out = cache.filter(["small", "full", "free", "ghost"], parse_request(gpu_pod("p", 12)))
    assert out.passed == ["free"]
    assert out.failed["full"] == "node(s) have 0 GPU(s) with 12 GiB free, the pod needs 1"
    assert "not in the gpushare extender's cache" in out.failed["ghost"]
    assert "largest GPU has 8 GiB" in out.unresolvable["small"]


def test_nodes_that_fail_alike_get_the_same_reason() -> None:
    """kube-scheduler counts the nodes per distinct reason: a reason naming its node (or each GPU's free memory)
    would make the pod's Event list every node of the cluster."""
    cache = ClusterCache()
    names = [f"n{i}" for i in range(5)]
    cache.replace_nodes([node_info(n, [16384, 16384]) for n in names])
    for i, name in enumerate(names):  # different free memory on each node, none with 12 GiB on a GPU
        cache.upsert_pod(gpu_pod(f"a{i}", 5 + i % 3, node=name, gpus=(0,), phase="Running"))
        cache.upsert_pod(gpu_pod(f"b{i}", 6 + i % 2, node=name, gpus=(1,), phase="Running"))
    out = cache.filter([*names, "ghost", "ghost2"], parse_request(gpu_pod("p", 12)))
    assert set(out.failed.values()) == {"node(s) have 0 GPU(s) with 12 GiB free, the pod needs 1",
                                        "node(s) are not in the gpushare extender's cache (not watched yet, or "
                                        "deleted); kube-scheduler will try again"}
    assert len(out.failed) == 7
    # Remembered per node state (five here), the reason is kept once: tables of many thousands of states share it.
    kept = [reason for table in cache._reason_tables.values() for reason in table.values()]
    assert len(kept) == 5 and len({id(reason) for reason in kept}) == 1


def test_reasons_give_memory_in_the_nodes_unit() -> None:
    cache = ClusterCache(MemoryUnit.MiB)  # nodes whose plugin publishes no unit count in MiB here
    cache.upsert_node(node_info("m", [16384]))
    cache.upsert_pod(gpu_pod("held", 10000, node="m", gpus=(0,), phase="Running"))
    names = ["m"]
    assert cache.filter(names, parse_request(gpu_pod("p", 8000))).failed["m"] == (
        "node(s) have 0 GPU(s) with 8000 MiB free, the pod needs 1")
    assert cache.filter(names, parse_request(gpu_pod("q", 20000))).unresolvable["m"] == (
        "node(s) have 0 GPU(s) of 20000 MiB or more, the pod needs 1 (their largest GPU has 16384 MiB)")


def test_nodes_in_one_state_share_a_reason_and_a_node_that_changed_is_judged_again() -> None:
    """A pod that no node passes gets every failing node's reason, worded once per node state: forty nodes in one
    state keep one reason, and a node whose state changed is judged on its new state, not given the old reason."""
    cache = ClusterCache()
    names = [f"n{i}" for i in range(40)]
    for name in names:
        cache.upsert_node(node_info(name, [16384, 16384]))
        cache.upsert_pod(gpu_pod(f"held-{name}", 10, node=name, gpus=(0,), phase="Running"))
        cache.upsert_pod(gpu_pod(f"also-{name}", 10, node=name, gpus=(1,), phase="Running"))
    twelve = parse_request(gpu_pod("p", 12))
    out = cache.filter(names, twelve)
    assert not out.passed
    assert out.failed == dict.fromkeys(names, "node(s) have 0 GPU(s) with 12 GiB free, the pod needs 1")
    assert sum(map(len, cache._reason_tables.values())) == 1

    cache.delete_pod(gpu_pod("held-n0", 10, node="n0", gpus=(0,), phase="Running"))
    out = cache.filter(names, twelve)
    assert out.passed == ["n0"]  # its new state fits: the remembered reason is not its own any more
    assert out.failed == dict.fromkeys(names[1:], "node(s) have 0 GPU(s) with 12 GiB free, the pod needs 1")

    twenty = parse_request(gpu_pod("q", 20))
    out = cache.filter(names, twenty)
    assert out.unresolvable == dict.fromkeys(
        names, "node(s) have 0 GPU(s) of 20 GiB or more, the pod needs 1 (their largest GPU has 16 GiB)")
    assert sum(map(len, cache._reason_tables.values())) == 1 + 2  # the second shape met two states


def test_a_state_is_judged_on_its_summary_while_a_node_is_in_it_and_by_name_once_it_ended() -> None:
    """Filter judges a state the shape has not met on the summary kept for that state, as long as some node is in it;
    a node read in a state that has just ended (its summary gone) is judged by name on its node's state now."""
    cache = ClusterCache()
    for name in ("a", "b", "c"):
        cache.upsert_node(node_info(name, [16384]))
    shared = cache._node_states["a"]
    assert cache._node_states["b"] == shared and list(cache._state_summaries) == [shared]
    cache.upsert_pod(gpu_pod("x", 10, node="a", gpus=(0,), phase="Running"))
    cache.delete_node("c")
    assert set(cache._state_summaries) == {cache._node_states["a"], shared}  # b is still in the first state
    cache.delete_node("b")
    assert list(cache._state_summaries) == [cache._node_states["a"]]
    del cache._state_summaries[cache._node_states["a"]]  # as if a's state ended while the window was read
    assert cache.filter(["a"], parse_request(gpu_pod("p", 6))).passed == ["a"]
    assert cache.filter(["a"], parse_request(gpu_pod("q", 7))).passed == []


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[NodeInfo], list[PodInfo], PodInfo]:
    nodes = []
    for i in range(draw(st.integers(1, 5))):
        gpus = draw(st.lists(st.tuples(st.sampled_from([8192, 16384, 24576]), st.sampled_from(["a", "b"])),
                             max_size=4))
        nodes.append(node_info(f"n{i}", [mib for mib, _ in gpus], [model for _, model in gpus],
                               cpu=draw(st.sampled_from(["2", "8"]))))
    pods = []
    for i in range(draw(st.integers(0, 12))):
        node = draw(st.sampled_from(nodes))
        pods.append(gpu_pod(f"p{i}", draw(st.integers(1, 8)), node=node.name,
                            gpus=(draw(st.integers(0, 3)),), phase="Running", cpu=draw(st.sampled_from(["0", "1"]))))
    count = draw(st.integers(1, 3))
    new = gpu_pod("new", count * draw(st.integers(1, 12)), count=count, cpu=draw(st.sampled_from(["0", "3"])))
    annotations = {}
    if draw(st.booleans()):
        annotations["gpushare.io/exclusive"] = "true"
    if draw(st.booleans()):
        annotations["gpushare.io/gpu-model"] = "a"
    if draw(st.booleans()):
        annotations["gpushare.io/gpu-compute"] = "50"
    return nodes, pods, PodInfo(**{**new.__dict__, "annotations": annotations})


@settings(max_examples=150, deadline=None)
@given(clusters())
def test_filter_agrees_with_the_model(cluster: tuple[list[NodeInfo], list[PodInfo], PodInfo]) -> None:
    nodes, pods, new = cluster
    cache = ClusterCache()
    cache.replace_nodes(nodes)
    request = parse_request(new)
    cache.filter([n.name for n in nodes], request)  # the shape's states are judged now: the pods must change them
    cache.replace_pods(pods[: len(pods) // 2])
    for pod in pods[len(pods) // 2:]:
        cache.upsert_pod(pod)
    out = cache.filter([n.name for n in nodes], request)
    expected = [n.name for n in nodes if build_node(n, MemoryUnit.GiB, pods).fits(request)]
    assert out.passed == expected
    # A shape new to the cache judges each state on the summary kept per state: those of the states nodes are in.
    assert cache._state_summaries == {state: cache._summaries[name] for name, state in cache._node_states.items()}
    assert set(out.failed) | set(out.unresolvable) == {n.name for n in nodes} - set(expected)
    assert not out.left_out
    # Unexplained: the same nodes pass; the others are worded only when none passes, else just listed.
    terse = cache.filter([n.name for n in nodes], request, explain=False)
    assert terse.passed == expected
    if expected:
        assert not terse.failed and not terse.unresolvable
        assert terse.left_out == [n.name for n in nodes if n.name not in expected]
    else:
        assert (terse.failed, terse.unresolvable, terse.left_out) == (out.failed, out.unresolvable, [])


def state_ids(cache: ClusterCache) -> dict[str, tuple[int, object]]:
    """Each node's state id in the cache, and the full signature of its state."""
    out = {}
    for name in cache.node_names():
        with cache.locked(name) as node:
            assert node is not None
            out[name] = (cache._node_states[name], state_signature(node))
    return out


@settings(max_examples=100, deadline=None)
@given(clusters())
def test_nodes_share_a_state_id_exactly_when_their_states_are_equal(
        cluster: tuple[list[NodeInfo], list[PodInfo], PodInfo]) -> None:
    nodes, pods, _ = cluster
    cache = ClusterCache()
    cache.replace_nodes(nodes)
    for pod in [None, *pods]:  # after every change
        if pod is not None:
            cache.upsert_pod(pod)
        ids = list(state_ids(cache).values())
        for state_id, signature in ids:
            assert {s for i, s in ids if i == state_id} == {signature}
            assert {i for i, s in ids if s == signature} == {state_id}


def test_state_ids_still_tell_states_apart_once_the_gpu_numbers_were_forgotten() -> None:
    """The remembered signatures name GPUs by numbers that start again from zero once too many GPUs were
    numbered: a state numbered afterwards must not take the id of an older state whose GPUs had its numbers."""
    cache = ClusterCache()
    # Eight GPUs of their own per node (no two GPU sizes alike): the node after these is numbered afresh.
    first = MAX_GPU_NUMBERS // 8
    for i in range(first):
        cache.upsert_node(node_info(f"old-{i}", [1024 * (8 * i + j + 1) for j in range(8)]))
    before = state_ids(cache)
    unseen = [1024 * (8 * first + j + 1) for j in range(8)]
    for name, sizes in [("new-0", [7168] * 8), ("new-1", unseen), ("twin-of-new-1", unseen)]:
        cache.upsert_node(node_info(name, sizes))
    after = state_ids(cache)
    assert len(cache._gpu_numbers) < MAX_GPU_NUMBERS
    old_ids = {state_id for state_id, _ in before.values()}
    assert after["new-0"][0] not in old_ids and after["new-1"][0] not in old_ids  # numbered like old-0 and old-1
    assert after["new-0"][0] != after["new-1"][0]
    assert after["twin-of-new-1"][0] == after["new-1"][0]
    assert {name: ids for name, ids in after.items() if name in before} == before  # nodes unchanged keep theirs


def test_repeated_filters_follow_every_change() -> None:
    cache = ClusterCache()
    cache.replace_nodes([node_info("a", [16384, 16384]), node_info("b", [16384, 16384])])
    names = ["a", "b"]
    request = parse_request(gpu_pod("p", 20, count=2))  # 10 units on each of two GPUs
    assert cache.filter(list(names), request).passed == ["a", "b"]
    cache.upsert_pod(gpu_pod("x", 8, node="a", gpus=(0,), phase="Running"))
    out = cache.filter(list(names), request)
    assert out.passed == ["b"]
    assert out.failed["a"] == "node(s) have 1 GPU(s) with 10 GiB free, the pod needs 2"
    cache.upsert_pod(gpu_pod("y", 8, node="a", gpus=(1,), phase="Running"))  # a still fails, with less free
    assert cache.filter(list(names), request).failed["a"] == "node(s) have 0 GPU(s) with 10 GiB free, the pod needs 2"
    cache.delete_pod(gpu_pod("y", 8, node="a", gpus=(1,), phase="Running"))
    cache.delete_pod(gpu_pod("x", 8, node="a", gpus=(0,), phase="Running"))
    assert cache.filter(list(names), request).passed == ["a", "b"]
    cache.delete_node("b")
    assert cache.filter(list(names), request).passed == ["a"]


def test_memoised_answers_last_until_the_node_changes_and_are_shared_by_equal_nodes() -> None:
    cache = ClusterCache()
    cache.upsert_node(node_info("n1", [16384]))
    cache.upsert_node(node_info("n2", [16384]))
    reads: list[str] = []

    def free(node: Node) -> int:
        reads.append(node.name)
        return node.gpus[0].free

    assert cache.evaluate_memoised(["n1", "n2", "gone"], "k", free) == [16, 16, None]
    assert cache.evaluate_memoised(["n1", "n2"], "k", free) == [16, 16]
    assert reads == ["n1"]  # n2 is in the same state: n1's answer is its answer; the second pass was all lookups
    request = parse_request(gpu_pod("p", 4))
    cache.reserve("n1", "default/p", "uid-p", request, lambda node: binpack(node, request))
    assert cache.evaluate_memoised(["n1", "n2"], "k", free) == [12, 16]
    assert cache.evaluate_memoised(["n1"], "other key", free) == [12]
    assert reads == ["n1", "n1", "n1"]  # only the changed node, and the new key, were read again


def test_memoised_answers_with_a_bound_on_reads_read_nothing_past_it() -> None:
    cache = ClusterCache()
    for name, mib in (("a1", 16384), ("a2", 16384), ("b", 8192), ("c", 4096)):
        cache.upsert_node(node_info(name, [mib]))
    reads: list[str] = []

    def free(node: Node) -> int:
        reads.append(node.name)
        return node.gpus[0].free

    # Three states without an answer (a1 and a2 share one): past a bound of two, nothing is read.
    assert cache.evaluate_memoised(["a1", "a2", "b", "c"], "k", free, max_reads=2) is None
    assert reads == []
    assert cache.evaluate_memoised(["a1", "b"], "k", free, max_reads=2) == [16, 8]
    # Now only c's state lacks an answer; "gone" is no node and needs no read.
    assert cache.evaluate_memoised(["a1", "a2", "b", "c", "gone"], "k", free, max_reads=1) == [16, 16, 8, 4, None]
    assert reads == ["a1", "b", "c"]


def test_memoised_answers_stay_right_for_more_keys_than_the_cache_keeps_tables() -> None:
    cache = ClusterCache()
    cache.upsert_node(node_info("n1", [16384]))
    cache.upsert_node(node_info("n2", [8192]))

    def free(node: Node) -> int:
        return node.gpus[0].free

    for key in range(2 * MAX_ANSWER_TABLES):
        assert cache.evaluate_memoised(["n2", "n1"], key, free) == [8, 16]
    request = parse_request(gpu_pod("p", 4))
    cache.reserve("n1", "default/p", "uid-p", request, lambda node: binpack(node, request))
    # Newest first: the last keys still have their tables, with no answer yet for n1's new state; the first keys'
    # tables are gone.
    for key in reversed(range(2 * MAX_ANSWER_TABLES)):
        assert cache.evaluate_memoised(["n2", "n1"], key, free) == [8, 12]


def nodes_of_many_cores() -> tuple[ClusterCache, list[str]]:
    """A cache of seven one-GPU nodes of 4 to 32 cores, and their names."""
    cache = ClusterCache()
    names = [f"n{cores}" for cores in (4, 6, 8, 12, 16, 24, 32)]
    for name in names:
        cache.upsert_node(node_info(name, [16384], cpu=name[1:]))
    return cache, names


def settled_by_bracket(cache: ClusterCache, names: list[str], key: Hashable, score: Callable[[Node], float],
                       bracket: Bracket) -> int:
    """How many of ``names`` the cache answered under ``key`` without reading them; every answer must be ``score``'s."""
    read: list[str] = []

    def counted(node: Node) -> float:
        read.append(node.name)
        return score(node)

    answers = cache.evaluate_memoised(names, key, counted, bracket=bracket)
    assert answers == [cache.evaluate(names, score)[name] for name in names], key
    return len(names) - len(read)


def test_scores_settled_from_other_cpu_requests_stay_right_past_what_the_index_keeps() -> None:
    """A score that never rises with the CPU asked, for many more CPU requests of one shape than the index of
    their answer tables keeps (``BRACKET_TABLES``), in no order: the index is pruned and every answer, settled from
    the nearest requests' tables or read, is the score itself (a table paired with the wrong request, or one past
    the nearest, would settle some wrongly)."""
    cache, names = nodes_of_many_cores()
    settled = 0
    for i in range(3 * BRACKET_TABLES):
        cpu = 1 + (i * 7919) % 12_000

        def score(node: Node, cpu: int = cpu) -> float:
            # Steps of an eighth of the node's CPU: equal for nearby requests, lower for more.
            return -float(cpu // (node.cpu_milli // 8))

        settled += settled_by_bracket(cache, names, ("shape", cpu), score, Bracket("shape", cpu, 0))
    assert settled > len(names) * BRACKET_TABLES  # most answers came from the bracket


def test_scores_settled_from_other_shares_of_a_class_and_cpu_requests_are_the_scores() -> None:
    """A score that never rises with the CPU nor the share asked within a class (``ClassedShares``), for requests of
    both in no order: every answer, settled from the tables of requests no larger in either and no smaller in either,
    or read, is the score itself. A request larger in share and smaller in CPU than the pod's bounds nothing either
    way: taken for a bound, it would settle some wrongly."""
    cache, names = nodes_of_many_cores()
    settled = 0
    for i in range(2 * BRACKET_TABLES):
        cpu, share = 1 + (i * 7919) % 12_000, 4000 + i % 4 * 30

        def score(node: Node, cpu: int = cpu, share: int = share) -> float:
            # Steps of an eighth of the node's CPU, and a step for each share, traded one for the other.
            return -float(cpu // (node.cpu_milli // 8) + (share - 4000) // 30)

        settled += settled_by_bracket(cache, names, ("shape", cpu, share), score, Bracket("shape", cpu, share))
    assert settled > len(names) * BRACKET_TABLES // 2  # many answers came from the bracket


def test_the_cpu_bracket_index_stays_bounded_as_versions_and_shapes_come_and_go() -> None:
    """Keys without CPU come and go (each price a policy learns makes new ones), each with requests of several CPUs:
    the index of answer tables by CPU request drops the entries of tables evicted and the keys left without any, so
    it never holds more than ``BRACKET_SWEEP_EVERY`` entries beyond one per table kept, and answers stay right."""
    cache = ClusterCache()
    cache.upsert_node(node_info("n", [16384], cpu="8"))
    largest = 0
    for n in range(4 * BRACKET_SWEEP_EVERY):
        version, cpu = n // 8, 1 + n % 8 * 1000

        def score(node: Node, cpu: int = cpu) -> float:
            return -float(cpu)

        assert cache.evaluate_memoised(["n"], (version, cpu), score, bracket=Bracket(version, cpu, 0)) == [-cpu]
        if n % 64 == 63:
            largest = max(largest, sum(len(points) for points, _ in cache._bracket_index.values()))
    assert MAX_ANSWER_TABLES < largest <= MAX_ANSWER_TABLES + BRACKET_SWEEP_EVERY


def test_a_frequent_shape_keeps_its_fit_and_score_tables_among_more_shapes_than_the_bounds() -> None:
    """The least recently used shape goes first: a workload of many CPU and memory sizes keeps its common ones."""
    cache = ClusterCache()
    cache.upsert_node(node_info("n1", [16384], cpu="64"))
    common = parse_request(gpu_pod("common", 4, cpu="1"))
    fits = cache._fit_table(common)  # identity tells a kept table from a new one
    table = cache._answer_table("common")
    for i in range(2 * MAX_ANSWER_TABLES):
        rare = parse_request(gpu_pod(f"rare-{i}", 4, cpu=f"{1000 + i}m"))
        assert cache.filter(["n1"], rare).passed == ["n1"]
        assert cache._fit_table(rare) is cache._fit_table(rare)  # the newest shape is kept, an older one went
        assert cache._answer_table(("rare", i)) is cache._answer_table(("rare", i))
        assert cache._fit_table(common) is fits
        assert cache._answer_table("common") is table
    assert cache.filter(["n1"], common).passed == ["n1"]


def test_a_full_table_forgets_the_states_no_node_is_in_any_more_and_keeps_the_live_ones(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A node that keeps changing fills its tables with states it has left; the nodes that stay as they are keep
    their answers when a table is full (it used to be cleared whole, and every node in the window asked again)."""
    monkeypatch.setattr("gpushare.cache.state.MAX_STATE_ANSWERS", 8)
    cache = ClusterCache()
    cache.upsert_node(node_info("steady", [16384], cpu="64"))
    cache.upsert_node(node_info("busy", [16384], cpu="64"))
    request = parse_request(gpu_pod("p", 4))
    reads: list[str] = []

    def free(node: Node) -> int:
        reads.append(node.name)
        return node.gpus[0].free

    assert cache.evaluate_memoised(["steady", "busy"], "k", free) == [16, 16]
    assert cache.filter(["steady", "busy"], request).passed == ["steady", "busy"]
    for i in range(20):  # a new CPU figure each time: a state of its own
        cache.upsert_pod(gpu_pod("x", 1 + i % 3, node="busy", gpus=(0,), phase="Running", cpu=f"{i + 1}m"))
        assert cache.evaluate_memoised(["busy"], "k", free) == [15 - i % 3]
        assert cache.filter(["busy"], request).passed == ["busy"]
        assert len(cache._answer_table("k")) <= 8 and len(cache._fit_table(request)) <= 8
    # Both nodes began in one state, read once through steady; then busy's twenty states, each once.
    assert reads.count("steady") == 1 and reads.count("busy") == 20
    assert cache.evaluate_memoised(["steady", "busy"], "k", free) == [16, 14]
    assert reads.count("steady") == 1, "steady's answer outlived busy's many states"
    assert cache._node_states["steady"] in cache._answer_table("k")
    assert cache._node_states["steady"] in cache._fit_table(request)


def test_the_tables_of_each_kind_hold_at_most_their_budget_together_and_the_least_recently_used_go_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpushare.cache.state.MAX_MEMO_ENTRIES", 20)
    monkeypatch.setattr("gpushare.cache.state.MEMO_CHECK_EVERY", 1)
    cache = ClusterCache()
    names = [f"n{i}" for i in range(6)]
    for i, name in enumerate(names):  # six GPU sizes: six states
        cache.upsert_node(node_info(name, [1024 * (4 + i)], cpu="64"))
    reads: list[tuple[int, str]] = []

    def reader(key: int) -> Callable[[Node], int]:
        def free(node: Node) -> int:
            reads.append((key, node.name))
            return node.gpus[0].free
        return free

    for key in range(10):
        assert cache.evaluate_memoised(names, key, reader(key)) == [4 + i for i in range(6)]
        request = parse_request(gpu_pod(f"p{key}", 2, cpu=f"{key + 1}m"))
        assert cache.filter(names, request).passed == names
        assert sum(map(len, cache._answer_tables.values())) <= 20
        assert sum(map(len, cache._fit_tables.values())) <= 20
    # The newest tables are whole, the oldest gone: their keys are asked again, the newest not.
    reads.clear()
    assert cache.evaluate_memoised(names, 9, reader(9)) == [4 + i for i in range(6)]
    assert cache.evaluate_memoised(names, 0, reader(0)) == [4 + i for i in range(6)]
    assert reads == [(0, name) for name in names]


def test_the_log_of_changes_names_each_changed_node_once_and_says_when_a_reader_fell_behind(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cache = ClusterCache()
    cache.upsert_node(node_info("a", [16384, 16384]))
    cache.upsert_node(node_info("b", [16384]))
    position, names = cache.changes(0)
    assert names == ["a", "b"]
    assert cache.changes(position) == (position, [])
    cache.upsert_pod(gpu_pod("one", 4, node="a", gpus=(0,), phase="Running"))
    cache.upsert_pod(gpu_pod("two", 4, node="a", gpus=(1,), phase="Running"))
    cache.delete_node("b")
    position, names = cache.changes(position)
    assert names == ["a", "b"], "a node changed twice is named once; a node gone is named too"
    # A log kept to four entries drops its older half when it grows past them.
    monkeypatch.setattr("gpushare.cache.state.MAX_CHANGES", 4)
    for i in range(5):
        cache.upsert_pod(gpu_pod(f"more-{i}", 1, node="a", gpus=(0,), phase="Running"))
    assert cache.changes(position)[1] is None, "the entries after the reader's position are gone"
    latest, names = cache.changes(cache.changes(0)[0] - 1)
    assert names == ["a"] and cache.changes(latest) == (latest, [])


def test_the_states_filter_passes_on_are_those_of_the_nodes_that_passed_in_order() -> None:
    """Scoring reads ``passed_states`` instead of looking the names up again: one out of step scores the wrong node."""
    cache = ClusterCache()
    for name, gpus in (("a", [16384]), ("b", [4096]), ("c", [16384, 16384]), ("d", [16384])):
        cache.upsert_node(node_info(name, gpus))
    cache.upsert_pod(gpu_pod("held", 10, node="d", gpus=(0,)))
    request = parse_request(gpu_pod("p", 8))
    for _ in range(2):  # judged afresh, then from the shape's table
        out = cache.filter(["d", "a", "b", "ghost", "c"], request, explain=False)
        assert out.passed == ["a", "c"]
        assert out.left_out == ["d", "b", "ghost"]
        assert out.passed_states == [cache._node_states[n] for n in out.passed]
        assert out.passed_states[0] != out.passed_states[1]  # different nodes: different states
        assert out.passed_counts == {state: 1 for state in out.passed_states}
    cache.upsert_pod(gpu_pod("more", 10, node="c", gpus=(0,)))  # c changes state and still fits
    out = cache.filter(["a", "c"], request, explain=False)
    assert out.passed == ["a", "c"] and out.passed_states == [cache._node_states["a"], cache._node_states["c"]]


@given(st.lists(st.sampled_from([f"node-{i}" for i in range(12)]), unique=True),
       st.dictionaries(st.sampled_from([f"node-{i}" for i in range(12)]), st.integers(1000, 1005)),
       st.dictionaries(st.integers(1000, 1005), st.booleans()), st.data())
def test_the_compiled_window_passes_read_and_split_the_names_one_by_one(
        names: list[str], node_states: dict[str, int], table: dict[int, bool], data: st.DataObject) -> None:
    """``read_window`` and ``sort_window`` (compiled) give what reading each name on its own gives: its state, the
    shape's remembered fit, then the names that fit in order with their states, each state's count and first name."""
    states, fits, unjudged = read_window(names, node_states, table)
    assert states == [node_states.get(name) for name in names]
    assert fits == [None if state is None else table.get(state) for state in states]
    assert unjudged == (None in fits)
    judged = [fit if fit is not None else data.draw(st.booleans()) for fit in fits]  # as the cache judges them
    passed, failing, passed_states, counts, firsts = sort_window(names, states, judged)
    assert passed == [name for name, fit in zip(names, judged, strict=True) if fit]
    assert failing == [name for name, fit in zip(names, judged, strict=True) if not fit]
    assert passed_states == [state for state, fit in zip(states, judged, strict=True) if fit]
    assert list(counts.items()) == [(state, passed_states.count(state)) for state in dict.fromkeys(passed_states)]
    assert list(firsts.items()) == [(state, passed[passed_states.index(state)])
                                    for state in dict.fromkeys(passed_states)]


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 3), st.integers(8, 60), st.lists(st.tuples(st.sampled_from(["bind", "unbind", "leave", "join"]),
                                                              st.integers(0, 59), st.sampled_from([4, 8, 16])),
                                                    max_size=40),
       st.randoms(use_true_random=False), st.data())
def test_the_favourite_is_the_highest_ranked_name_of_the_best_states_whatever_the_nodes_went_through(
        seed: int, count: int, changes: list[tuple[str, int, int]], rng: random.Random, data: st.DataObject) -> None:
    """Filter finds the favourite by walking each best state's nodes in priority order: it must be the name that
    ranking the window's names in those states would choose, after binds, releases and nodes that come and go.
    Equal nodes share a state, so the walk (a state of many nodes, many of them in the window) is taken."""
    cache = ClusterCache(tie_seed=seed)
    names = [f"node-{i}" for i in range(count)]
    for name in names:
        cache.upsert_node(node_info(name, [16384, 16384]))
    for step, (what, index, units) in enumerate(changes):
        name = names[index % count]
        pod = gpu_pod(f"p{step}", units, node=name, gpus=(step % 2,), phase="Running")
        if what == "bind":
            cache.upsert_pod(pod)
        elif what == "unbind":
            for key in [k for k, n in cache._pod_nodes.items() if n == name][:1]:
                cache.delete_pod(gpu_pod(key.split("/")[1], units, node=name, gpus=(0,), phase="Running"))
        elif what == "leave":
            cache.delete_node(name)
        else:
            cache.upsert_node(node_info(name, [16384, 16384]))
    window = [*rng.sample(names, data.draw(st.integers(1, count))), "ghost"]
    out = cache.filter(window, parse_request(gpu_pod("new", 4)), explain=False)
    if not out.passed:
        return
    states = out.passed_states
    best = set(data.draw(st.lists(st.sampled_from(sorted(set(states))), min_size=1, unique=True)))
    expected = max((n for n, s in zip(out.passed, states, strict=True) if s in best),
                   key=lambda n: node_priority(n, seed))
    assert cache.favourite(out.passed, states, best) == expected
    assert cache.favourite(out.passed, states, best, out.passed_counts) == expected  # as filter asks it


def test_a_status_update_of_a_pod_as_accounted_rebuilds_nothing() -> None:
    """Kubelets update a running pod's status several times; the watch shows each, and none changes what
    decisions read: the node's state and summary are not rebuilt for it. A changed placement still counts."""
    cache = ClusterCache()
    cache.upsert_node(node_info("a", [16384, 16384]))
    cache.upsert_pod(gpu_pod("one", 4, node="a", gpus=(0,), phase="Pending"))
    summary = cache._summaries["a"]
    cache.upsert_pod(gpu_pod("one", 4, node="a", gpus=(0,), phase="Running"))
    assert cache._summaries["a"] is summary
    assert used(cache, "a") == [4, 0]
    cache.upsert_pod(gpu_pod("one", 4, node="a", gpus=(1,), phase="Running"))
    assert cache._summaries["a"] is not summary
    assert used(cache, "a") == [0, 4]


def test_the_log_of_changes_leaves_out_events_that_change_no_state() -> None:
    """The watch confirming a bind's reservation, or a node's status heartbeat, changes nothing decisions read:
    a policy that follows the cluster must not copy the node again for it. A real change is still named."""
    cache = ClusterCache()
    info = node_info("a", [16384, 16384])
    cache.upsert_node(info)
    request = parse_request(gpu_pod("one", 4))
    position = cache.changes(0)[0]
    cache.reserve("a", "default/one", "uid-one", request, lambda n: binpack(n, request))
    position, names = cache.changes(position)
    assert names == ["a"], "the reservation changed the node"
    cache.upsert_pod(gpu_pod("one", 4, node="a", gpus=(0,), phase="Running"))
    cache.upsert_node(info)
    assert cache.changes(position) == (position, []), "the bound pod and the same node again changed nothing"
    assert used(cache, "a") == [4, 0]
    cache.delete_pod(gpu_pod("one", 4, node="a", gpus=(0,), phase="Running"))
    position, names = cache.changes(position)
    assert names == ["a"], "the pod that left changed the node"
    cache.delete_node("a")
    assert cache.changes(position)[1] == ["a"], "a node that left is named"


def test_answers_carry_over_from_the_previous_version_where_the_policy_says_they_still_hold() -> None:
    """A repricing policy's new version starts a new table; the states whose answers it did not touch take their
    answer from the family's previous table instead of being read again, and are not counted as reads."""
    cache = ClusterCache()
    cache.replace_nodes([node_info("a1", [16384]), node_info("a2", [8192]),
                         node_info("b1", [16384], models=["G2"]), node_info("b2", [4096], models=["G2"])])
    reads: list[str] = []

    def free(node: Node) -> int:
        reads.append(node.name)
        return node.gpus[0].free

    def untouched(version: int, node: Node) -> bool:
        assert version == 1
        return node.gpus[0].model == "G2"  # version 2 moved only the T4 price

    names = ["a1", "a2", "b1", "b2"]
    first = Carry("family", 1, untouched)
    assert cache.evaluate_memoised(names, ("family", 1), free, carry=first) == [16, 8, 16, 4]
    assert reads == names
    reads.clear()
    second = Carry("family", 2, untouched)
    # One read allowed: the two G2 states carry over, so the two T4 states are all that is left to read.
    assert cache.evaluate_memoised(names, ("family", 2), free, max_reads=1, carry=second) is None
    assert cache.evaluate_memoised(names, ("family", 2), free, max_reads=2, carry=second) == [16, 8, 16, 4]
    assert reads == ["a1", "a2"]
    # Another family, or no carry, reads everything.
    reads.clear()
    assert cache.evaluate_memoised(names, ("other", 2), free, carry=Carry("other", 2, untouched)) == [16, 8, 16, 4]
    assert cache.evaluate_memoised(names, ("plain", 2), free) == [16, 8, 16, 4]
    assert reads == names + names
    # A state that changed since has no answer to carry.
    request = parse_request(gpu_pod("p", 4))
    cache.reserve("b1", "default/p", "uid-p", request, lambda node: binpack(node, request))
    reads.clear()
    third = Carry("family", 3, lambda version, node: version == 2)
    assert cache.evaluate_memoised(names, ("family", 3), free, carry=third) == [16, 8, 12, 4]
    assert reads == ["b1"]


def test_answers_do_not_carry_over_from_a_table_no_longer_kept() -> None:
    cache = ClusterCache()
    cache.replace_nodes([node_info("n1", [16384])])
    reads: list[str] = []

    def free(node: Node) -> int:
        reads.append(node.name)
        return node.gpus[0].free

    def always(version: int, node: Node) -> bool:
        return True

    assert cache.evaluate_memoised(["n1"], ("family", 1), free, carry=Carry("family", 1, always)) == [16]
    for key in range(MAX_ANSWER_TABLES):  # newer keys push the family's first table out
        assert cache.evaluate_memoised(["n1"], key, free) == [16]
    reads.clear()
    assert cache.evaluate_memoised(["n1"], ("family", 2), free, carry=Carry("family", 2, always)) == [16]
    assert reads == ["n1"]


def test_each_model_rule_judges_the_models_it_met_by_its_own_answers() -> None:
    """A fit check remembers its rule's answer per GPU model for the states it judges next; another request's check,
    with another rule, answers by its own, however the two are interleaved."""
    v100 = NodeSummary(cpu_free=8000, memory_free=8192, frees=(8,), gpus=(("V100", 8, 0, False),))
    t4 = NodeSummary(cpu_free=8000, memory_free=8192, frees=(8,), gpus=(("T4", 8, 0, False),))
    mixed = NodeSummary(cpu_free=8000, memory_free=8192, frees=(8, 8),
                        gpus=(("T4", 8, 0, False), ("V100", 8, 0, False)))
    only_v100 = fit_check(PodRequest(per_gpu=4, models=ModelRule(include=("v100",))))
    not_v100 = fit_check(PodRequest(per_gpu=4, models=ModelRule(exclude=("v100",))))
    both_v100 = fit_check(PodRequest(per_gpu=4, gpu_count=2, models=ModelRule(include=("v100",))))
    assert [only_v100(v100), not_v100(v100), only_v100(t4), not_v100(t4)] == [True, False, False, True]
    # Two GPUs, one of each model: a pod wanting two V100s counts the V100 only, whatever it met before.
    assert [only_v100(mixed), not_v100(mixed), both_v100(v100), both_v100(mixed)] == [True, True, False, False]
