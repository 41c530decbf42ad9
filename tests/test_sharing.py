"""Sharing rules (GPU affinity, anti-affinity, exclusion) and the compute limit: the readers, the model's rules,
the memoised answers, and preemption under them."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from gpushare.cache.state import ClusterCache
from gpushare.contract import (
    ANN_AFFINITY,
    ANN_ANTI_AFFINITY,
    ANN_COMPUTE,
    ANN_COMPUTE_LIMIT,
    ANN_EXCLUSION,
    ANN_EXCLUSIVE,
    ANN_GPU_INDICES,
    ANN_IDX,
    KUBESHARE_AFFINITY,
    KUBESHARE_ANTI_AFFINITY,
    KUBESHARE_EXCLUSION,
    KUBESHARE_GPU_LIMIT,
    KUBESHARE_GPU_REQUEST,
    NO_SHARING,
    RESOURCE_GPU_COUNT,
    RESOURCE_GPU_MEM,
    ContainerInfo,
    NodeInfo,
    PodInfo,
    PodRequest,
    RequestError,
    Sharing,
    compute_share,
    parse_request,
    read_assignment,
    sharing_rules,
)
from gpushare.model import GPU, Node, Placement, state_signature
from gpushare.policies.registry import make_policy, policy_names
from gpushare.policies.simple import Binpack
from gpushare.preemption import find_victims


def pod(annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None, units: int = 4,
        name: str = "p", node: str | None = None) -> PodInfo:
    return PodInfo(namespace="default", name=name, uid="uid-" + name, node_name=node, annotations=annotations or {},
                   labels=labels or {}, containers=(ContainerInfo("c", limits={RESOURCE_GPU_MEM: str(units)}),))


# -- readers ------------------------------------------------------------------------------------------------


def test_sharing_values_from_our_annotations_kubeshare_annotations_and_kubeshare_labels() -> None:
    ours = {ANN_AFFINITY: "red", ANN_ANTI_AFFINITY: "solo", ANN_EXCLUSION: "team-a"}
    assert sharing_rules(pod(ours)) == Sharing("red", "solo", "team-a")
    theirs = {KUBESHARE_AFFINITY: "red", KUBESHARE_ANTI_AFFINITY: "solo", KUBESHARE_EXCLUSION: "team-a"}
    assert sharing_rules(pod(theirs)) == Sharing("red", "solo", "team-a")
    assert sharing_rules(pod(labels=theirs)) == Sharing("red", "solo", "team-a")
    # Ours wins over the alias, an annotation over a label; an empty value is none.
    assert sharing_rules(pod({ANN_AFFINITY: "ours", KUBESHARE_AFFINITY: "theirs"},
                             {KUBESHARE_AFFINITY: "label"})).affinity == "ours"
    assert sharing_rules(pod({KUBESHARE_EXCLUSION: "ann"}, {KUBESHARE_EXCLUSION: "label"})).exclusion == "ann"
    assert sharing_rules(pod({ANN_AFFINITY: " "})) == Sharing()
    assert parse_request(pod(ours)).sharing == Sharing("red", "solo", "team-a")


@pytest.mark.parametrize(("name", "value"), [(ANN_AFFINITY, "red team"), (ANN_ANTI_AFFINITY, "-x"),
                                             (KUBESHARE_EXCLUSION, "x" * 64), (ANN_EXCLUSION, "a/b")])
def test_malformed_sharing_values_are_refused_naming_the_field(name: str, value: str) -> None:
    with pytest.raises(RequestError) as caught:
        parse_request(pod({name: value}))
    assert str(caught.value).startswith(f"Pod default/p has {name}=")
    assert "use 1 to 63 letters, digits, '-', '_' or '.'" in str(caught.value)


def test_an_exclusive_pod_cannot_have_an_affinity_group() -> None:
    with pytest.raises(RequestError, match="an exclusive pod shares its GPUs with no one"):
        parse_request(pod({ANN_EXCLUSIVE: "true", ANN_AFFINITY: "red"}))
    assert parse_request(pod({ANN_EXCLUSIVE: "true", ANN_EXCLUSION: "e"})).sharing.exclusion == "e"


def test_compute_request_and_limit() -> None:
    assert compute_share(pod()) == (0, 0)
    assert compute_share(pod({ANN_COMPUTE: "30"})) == (30, 30)  # the share is also the ceiling by default
    assert compute_share(pod({ANN_COMPUTE: "30", ANN_COMPUTE_LIMIT: "80"})) == (30, 80)
    assert compute_share(pod({ANN_COMPUTE_LIMIT: "50"})) == (0, 50)  # a ceiling without a guarantee
    # KubeShare's fractions of GPU time, as labels (2.0) or annotations (1.0), rounded half up to whole percent.
    assert compute_share(pod(labels={KUBESHARE_GPU_REQUEST: "0.2", KUBESHARE_GPU_LIMIT: "0.5"})) == (20, 50)
    assert compute_share(pod({KUBESHARE_GPU_REQUEST: "0.125", KUBESHARE_GPU_LIMIT: "1.0"})) == (13, 100)
    assert compute_share(pod({ANN_COMPUTE: "10"}, {KUBESHARE_GPU_REQUEST: "0.9"})) == (10, 10)
    request = parse_request(pod({ANN_COMPUTE: "30", ANN_COMPUTE_LIMIT: "80"}))
    assert (request.compute_percent, request.compute_limit) == (30, 80)


@pytest.mark.parametrize(("given", "labels", "says"), [
    ({ANN_COMPUTE: "30", ANN_COMPUTE_LIMIT: "20"}, {},
     f"has {ANN_COMPUTE_LIMIT}='20'; use a whole percentage from 30 to 100"),
    ({ANN_COMPUTE_LIMIT: "0"}, {}, f"has {ANN_COMPUTE_LIMIT}='0'; use a whole percentage from 1 to 100"),
    ({ANN_COMPUTE_LIMIT: "101"}, {}, f"has {ANN_COMPUTE_LIMIT}='101'; use a whole percentage"),
    ({ANN_COMPUTE: "half"}, {}, f"has {ANN_COMPUTE}='half'; use a whole percentage from 0 to 100"),
    ({}, {KUBESHARE_GPU_REQUEST: "1.5"}, f"has {KUBESHARE_GPU_REQUEST}='1.5'; use a fraction of GPU time from 0"),
    ({}, {KUBESHARE_GPU_REQUEST: "50%"}, f"has {KUBESHARE_GPU_REQUEST}='50%'; use a fraction"),
    ({}, {KUBESHARE_GPU_REQUEST: "0.6", KUBESHARE_GPU_LIMIT: "0.5"},
     f"has {KUBESHARE_GPU_LIMIT}='0.5'; use a fraction of GPU time from 0.6 to 1.0"),
])
def test_malformed_compute_values_are_refused_naming_the_field(given: dict[str, str], labels: dict[str, str],
                                                               says: str) -> None:
    with pytest.raises(RequestError) as caught:
        parse_request(pod(given, labels))
    assert f"Pod default/p {says}" in str(caught.value)


def test_a_bound_pod_carries_its_limit_and_sharing_values_to_the_device_plugin() -> None:
    annotations = {ANN_COMPUTE: "20", ANN_COMPUTE_LIMIT: "70", ANN_AFFINITY: "red", ANN_IDX: "1",
                   ANN_GPU_INDICES: "1"}
    assignment = read_assignment(pod(annotations, node="n"))
    assert assignment is not None
    assert (assignment.compute_percent, assignment.compute_limit, assignment.sharing) == (20, 70, Sharing("red"))


# -- the model ----------------------------------------------------------------------------------------------


def gpus(count: int = 2, total: int = 16) -> list[GPU]:
    return [GPU(index=i, model="T4", total=total) for i in range(count)]


def put(node: Node, key: str, gpu_indices: tuple[int, ...], per_gpu: int = 2, priority: int = 0,
        sharing: Sharing = NO_SHARING, compute: int = 0, exclusive: bool = False) -> None:
    node.add(key, Placement(gpu_indices, per_gpu, compute, exclusive, priority=priority, uid="uid-" + key,
                            sharing=sharing), strict=True)


def test_affinity_joins_its_group_and_keeps_other_groups_out() -> None:
    node = Node("n", gpus(3))
    put(node, "red-1", (0,), sharing=Sharing(affinity="red"))
    put(node, "blue-1", (1,), sharing=Sharing(affinity="blue"))
    red = PodRequest(per_gpu=2, sharing=Sharing(affinity="red"))
    # Before the cache knows the group is placed, any GPU without another group will do.
    assert [g.index for g in node.hosts(red)] == [0, 2]
    held = replace(red, affinity_held=True)
    assert [g.index for g in node.hosts(held)] == [0]
    assert [g.index for g in node.hosts(PodRequest(per_gpu=2))] == [0, 1, 2]  # plain pods join any group
    put(node, "red-2", (0,), per_gpu=13, sharing=Sharing(affinity="red"))
    assert not node.fits(held)
    assert node.failure_reason(held) == (
        "node(s) have 0 GPU(s) the pod may share, it needs 1; the pod's sharing rules refuse GPU1 because it holds the "
        f"affinity group {ANN_AFFINITY}=blue; GPU2 because the pod's affinity group {ANN_AFFINITY}=red is on other "
        "GPUs")


def test_anti_affinity_never_shares_a_gpu_with_the_same_value() -> None:
    node = Node("n", gpus(2))
    put(node, "solo-1", (0,), sharing=Sharing(anti_affinity="solo"))
    assert [g.index for g in node.hosts(PodRequest(per_gpu=2, sharing=Sharing(anti_affinity="solo")))] == [1]
    assert [g.index for g in node.hosts(PodRequest(per_gpu=2, sharing=Sharing(anti_affinity="other")))] == [0, 1]
    node.remove("solo-1")
    assert [g.index for g in node.hosts(PodRequest(per_gpu=2, sharing=Sharing(anti_affinity="solo")))] == [0, 1]


def test_exclusion_gives_a_gpu_to_one_value_and_no_value_is_a_value() -> None:
    node = Node("n", gpus(3))
    put(node, "x-1", (0,), sharing=Sharing(exclusion="x"))
    put(node, "plain", (1,))
    x, y, plain = (PodRequest(per_gpu=2, sharing=Sharing(exclusion="x")),
                   PodRequest(per_gpu=2, sharing=Sharing(exclusion="y")), PodRequest(per_gpu=2))
    assert [g.index for g in node.hosts(x)] == [0, 2]
    assert [g.index for g in node.hosts(y)] == [2]
    assert [g.index for g in node.hosts(plain)] == [1, 2]
    put(node, "x-2", (0,), sharing=Sharing(exclusion="x"))
    node.remove("x-1")
    assert [g.index for g in node.hosts(plain)] == [1, 2]  # x-2 still holds GPU 0 for x
    node.remove("x-2")
    assert [g.index for g in node.hosts(y)] == [0, 2]


def test_every_gpu_of_a_multi_gpu_pod_obeys_the_rules() -> None:
    node = Node("n", gpus(3))
    put(node, "wide", (0, 1), sharing=Sharing(anti_affinity="solo", exclusion="x"))
    assert node.gpus[0].exclusion == node.gpus[1].exclusion == {"x": 1}
    wanted = PodRequest(per_gpu=2, gpu_count=2, sharing=Sharing(anti_affinity="solo", exclusion="x"))
    assert not node.fits(wanted)
    assert node.fits(replace(wanted, sharing=Sharing(exclusion="x")))


def test_the_state_signature_tells_apart_nodes_that_differ_only_in_sharing_values() -> None:
    one, other = Node("a", gpus(1)), Node("b", gpus(1))
    put(one, "p", (0,), sharing=Sharing(exclusion="x"))
    put(other, "p", (0,))
    assert state_signature(one) != state_signature(other)
    put(other, "q", (0,), sharing=Sharing(anti_affinity="solo"))
    put(one, "q", (0,), sharing=Sharing(exclusion="x", anti_affinity="solo"))
    assert state_signature(one) != state_signature(other)


def node_info(name: str) -> NodeInfo:
    return NodeInfo(name=name, capacity={RESOURCE_GPU_MEM: "32", RESOURCE_GPU_COUNT: "2"})


def bound(name: str, node: str, gpu: int, annotations: dict[str, str]) -> PodInfo:
    return pod({**annotations, ANN_IDX: str(gpu), ANN_GPU_INDICES: str(gpu)}, units=4, name=name, node=node)


def test_memoised_answers_follow_sharing_values() -> None:
    """Two nodes in the same memory state, one holding an exclusion-x pod: the answer for one must not serve
    the other, though the memo shares answers between nodes of equal state."""
    cache = ClusterCache()
    for name in ("a", "b"):
        cache.upsert_node(node_info(name))
    cache.upsert_pod(bound("x-pod", "a", 0, {ANN_EXCLUSION: "x"}))
    cache.upsert_pod(bound("plain", "b", 0, {}))
    cache.upsert_pod(bound("x-pod-2", "a", 1, {ANN_EXCLUSION: "x"}))
    cache.upsert_pod(bound("plain-2", "b", 1, {}))
    binpack = Binpack()
    x = cache.resolve(parse_request(pod({ANN_EXCLUSION: "x"})))
    plain = parse_request(pod())

    def score(node: Node, request: PodRequest) -> tuple[int, ...] | None:
        found = binpack.evaluate(node, request)
        return None if found is None else found.gpus

    for request, fits_on in ((x, "a"), (plain, "b")):
        answers = cache.evaluate_memoised(["a", "b"], ("binpack", request.sharing),
                                          lambda n, r=request: score(n, r))  # type: ignore[misc]
        assert answers is not None
        assert {name for name, found in zip(["a", "b"], answers, strict=True) if found is not None} == {fits_on}
    assert cache.filter(["a", "b"], x).passed == ["a"]
    assert cache.filter(["a", "b"], plain).passed == ["b"]


def test_the_cache_resolves_an_affinity_group_once_it_holds_a_gpu() -> None:
    cache = ClusterCache()
    for name in ("a", "b"):
        cache.upsert_node(node_info(name))
    red = parse_request(pod({ANN_AFFINITY: "red"}))
    assert not cache.resolve(red).affinity_held
    assert cache.filter(["a", "b"], cache.resolve(red)).passed == ["a", "b"]
    first = bound("red-1", "b", 1, {ANN_AFFINITY: "red"})
    cache.upsert_pod(first)
    held = cache.resolve(red)
    assert held.affinity_held
    outcome = cache.filter(["a", "b"], held)
    assert outcome.passed == ["b"]
    assert outcome.failed == {"a": f"pods of {ANN_AFFINITY}=red already hold GPUs on node(s) b, and the pod may "
                                   "only join them"}
    assert Binpack().evaluate(cache_node(cache, "b"), held).gpus == (1,)  # type: ignore[union-attr]
    cache.delete_pod(first)
    assert not cache.resolve(red).affinity_held


def cache_node(cache: ClusterCache, name: str) -> Node:
    with cache.locked(name) as node:
        assert node is not None
        return node


# -- preemption ---------------------------------------------------------------------------------------------


def test_victims_clear_a_sharing_conflict_where_memory_alone_would_fit() -> None:
    node = Node("n", gpus(2))
    put(node, "x-low", (0,), priority=1, sharing=Sharing(exclusion="x"))
    put(node, "full", (1,), per_gpu=16, priority=100)
    plain = PodRequest(per_gpu=4, priority=10)
    found = find_victims(node, plain)
    assert found is not None and [v.key for v in found.victims] == ["x-low"]
    assert node.gpus[0].exclusion == {"x": 1}  # the search's scratch copies left the node's counts alone
    solo = PodRequest(per_gpu=4, priority=10, sharing=Sharing(anti_affinity="solo"))
    put(node, "solo-low", (0,), priority=2, sharing=Sharing(anti_affinity="solo", exclusion="x"))
    found = find_victims(node, replace(solo, sharing=Sharing(anti_affinity="solo", exclusion="x")))
    assert found is not None and [v.key for v in found.victims] == ["solo-low"]


def test_victims_never_break_up_the_affinity_group_the_pod_must_join() -> None:
    node = Node("n", gpus(2))
    put(node, "red-low", (0,), per_gpu=8, priority=1, sharing=Sharing(affinity="red"))
    put(node, "filler", (0,), per_gpu=8, priority=2)
    red = PodRequest(per_gpu=6, priority=10, sharing=Sharing(affinity="red"), affinity_held=True)
    found = find_victims(node, red)
    assert found is not None and [v.key for v in found.victims] == ["filler"]
    node.remove("filler")
    put(node, "filler", (0,), per_gpu=8, priority=50)
    assert find_victims(node, red) is None  # evicting the group itself leaves nothing to join


# -- the property ------------------------------------------------------------------------------------------

SHAPES = st.tuples(
    st.integers(0, 4),  # priority
    st.sampled_from([1, 2, 4, 6, 8, 12, 16]),  # per GPU
    st.sampled_from([1, 1, 1, 2]),  # GPU count
    st.sampled_from([0, 0, 20, 50, 70]),  # compute
    st.sampled_from([False, False, False, True]),  # exclusive
    st.sampled_from(["", "", "red", "blue"]),
    st.sampled_from(["", "", "solo"]),
    st.sampled_from(["", "", "", "x", "y"]),
)


def check_cluster(nodes: list[Node]) -> None:
    """Recount every GPU from the placements alone: capacity and the sharing rules hold."""
    for node in nodes:
        on: dict[int, list[Placement]] = {g.index: [] for g in node.gpus}
        for placement in node.placements.values():
            for index in placement.gpu_indices:
                on[index].append(placement)
        for gpu in node.gpus:
            held = on[gpu.index]
            memory = sum(gpu.total if p.exclusive else p.per_gpu for p in held)
            assert memory <= gpu.total, f"GPU {gpu.index} of {node.name} holds {memory} of {gpu.total}"
            assert sum(p.compute_percent for p in held) <= 100
            assert not any(p.exclusive for p in held) or len(held) == 1
            assert len({p.sharing.affinity for p in held} - {""}) <= 1
            anti = Counter(p.sharing.anti_affinity for p in held if p.sharing.anti_affinity)
            assert all(n == 1 for n in anti.values())
            assert len({p.sharing.exclusion for p in held}) <= 1


@settings(max_examples=150, deadline=None)
@given(st.lists(SHAPES, min_size=1, max_size=30), st.sampled_from(policy_names()))
def test_placing_and_preempting_never_overcommits_nor_evicts_an_equal_or_higher_priority(
        pods: list[tuple[int, int, int, int, bool, str, str, str]], policy_name: str) -> None:
    nodes = [Node(f"n{i}", gpus(2)) for i in range(2)]
    policy = make_policy(policy_name)
    for number, (priority, per_gpu, count, compute, exclusive, affinity, anti, exclusion) in enumerate(pods):
        key = f"p{number}"
        sharing = Sharing("" if exclusive else affinity, anti, exclusion)
        held = bool(sharing.affinity) and any(sharing.affinity in g.affinity for n in nodes for g in n.gpus)
        request = PodRequest(per_gpu=per_gpu, gpu_count=count, exclusive=exclusive, compute_percent=compute,
                             priority=priority, sharing=sharing, affinity_held=held)
        target = next((n for n in nodes if n.fits(request)), None)
        if target is None:
            for node in nodes:
                found = find_victims(node, request)
                if found is None:
                    continue
                assert all(v.priority < priority for v in found.victims)
                for victim in found.victims:
                    node.remove(victim.key)
                assert node.fits(request), "the victims chosen did not make room"
                event("preempted" + (" to join an affinity group" if held else ""))
                target = node
                break
        if target is not None:
            candidate = policy.evaluate(target, request)
            assert candidate is not None
            if held:  # the group's later pods only join GPUs it already holds
                assert all(sharing.affinity in g.affinity for i in candidate.gpus if (g := target.gpu(i)))
            put(target, key, candidate.gpus, per_gpu, priority, sharing, compute, exclusive)
        check_cluster(nodes)


@pytest.mark.parametrize("policy", policy_names())
def test_policies_memoised_gpu_choices_never_cross_sharing_states(policy: str) -> None:
    # Two nodes alike but for the sharing values of the pod on GPU 0: a policy that answered the first from a
    # memo keyed without them would put the second pod where its rules forbid.
    chooser = make_policy(policy)
    plain, marked = Node("plain", gpus(1)), Node("marked", gpus(1))
    put(plain, "p", (0,), 4)
    put(marked, "p", (0,), 4, sharing=Sharing(exclusion="x"))
    request = PodRequest(per_gpu=4)
    assert chooser.evaluate(plain, request) is not None
    assert chooser.evaluate(marked, request) is None
    solo = PodRequest(per_gpu=4, sharing=Sharing(anti_affinity="solo"))
    lonely = Node("lonely", gpus(1))
    put(lonely, "s", (0,), 4, sharing=Sharing(anti_affinity="solo"))
    assert chooser.evaluate(Node("empty", gpus(1)), solo) is not None
    assert chooser.evaluate(lonely, solo) is None
