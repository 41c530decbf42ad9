"""Gangs in the core: the one reader of the gang labels, the planner, and the cache's atomic holds."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.cache.state import ClusterCache, ReservationError
from gpushare.contract import (
    ANN_GROUP_MIN_MEMBER,
    KUBESHARE_GROUP_HEADCOUNT,
    KUBESHARE_GROUP_NAME,
    KUBESHARE_GROUP_THRESHOLD,
    LABEL_POD_GROUP,
    Assignment,
    GangRef,
    MemoryUnit,
    NodeInfo,
    PodInfo,
    PodRequest,
    RequestError,
    read_gang,
)
from gpushare.model import GPU, Node
from gpushare.policies import make_policy
from gpushare.policies.base import node_priority
from gpushare.policies.gang import Member, Placed, plan_gang


def grouped(labels: dict[str, str], annotations: dict[str, str] | None = None) -> PodInfo:
    return PodInfo(namespace="team", name="worker-0", labels=labels, annotations=annotations or {})


def test_a_pod_without_gang_labels_is_in_no_gang() -> None:
    assert read_gang(grouped({"app": "x"})) is None


def test_coscheduling_label_with_and_without_the_min_member_annotation() -> None:
    assert read_gang(grouped({LABEL_POD_GROUP: "train"})) == GangRef("team", "train", None, LABEL_POD_GROUP)
    ref = read_gang(grouped({LABEL_POD_GROUP: "train"}, {ANN_GROUP_MIN_MEMBER: " 4 "}))
    assert ref == GangRef("team", "train", 4, LABEL_POD_GROUP)
    assert ref.key == "team/train"


@pytest.mark.parametrize(("headcount", "threshold", "minimum"), [
    ("4", None, 4), ("4", "1", 4), ("4", "0.5", 2), ("3", "0.5", 2), ("10", "0.01", 1), ("5", "0.6", 3)])
def test_kubeshare_threshold_is_a_fraction_of_the_headcount(headcount: str, threshold: str | None,
                                                            minimum: int) -> None:
    labels = {KUBESHARE_GROUP_NAME: "job", KUBESHARE_GROUP_HEADCOUNT: headcount}
    if threshold is not None:
        labels[KUBESHARE_GROUP_THRESHOLD] = threshold
    assert read_gang(grouped(labels)) == GangRef("team", "job", minimum, KUBESHARE_GROUP_NAME)


@pytest.mark.parametrize(("labels", "annotations", "field"), [
    ({LABEL_POD_GROUP: " "}, {}, LABEL_POD_GROUP),
    ({LABEL_POD_GROUP: "g"}, {ANN_GROUP_MIN_MEMBER: "0"}, ANN_GROUP_MIN_MEMBER),
    ({LABEL_POD_GROUP: "g"}, {ANN_GROUP_MIN_MEMBER: "two"}, ANN_GROUP_MIN_MEMBER),
    ({LABEL_POD_GROUP: "g"}, {ANN_GROUP_MIN_MEMBER: "9" * 5000}, ANN_GROUP_MIN_MEMBER),
    ({KUBESHARE_GROUP_NAME: "j"}, {}, KUBESHARE_GROUP_HEADCOUNT),
    ({KUBESHARE_GROUP_NAME: "j", KUBESHARE_GROUP_HEADCOUNT: "0"}, {}, KUBESHARE_GROUP_HEADCOUNT),
    ({KUBESHARE_GROUP_NAME: "j", KUBESHARE_GROUP_HEADCOUNT: "-3"}, {}, KUBESHARE_GROUP_HEADCOUNT),
    ({KUBESHARE_GROUP_NAME: "j", KUBESHARE_GROUP_HEADCOUNT: "4", KUBESHARE_GROUP_THRESHOLD: "0"}, {},
     KUBESHARE_GROUP_THRESHOLD),
    ({KUBESHARE_GROUP_NAME: "j", KUBESHARE_GROUP_HEADCOUNT: "4", KUBESHARE_GROUP_THRESHOLD: "1.5"}, {},
     KUBESHARE_GROUP_THRESHOLD),
    ({KUBESHARE_GROUP_NAME: "j", KUBESHARE_GROUP_HEADCOUNT: "4", KUBESHARE_GROUP_THRESHOLD: "nan"}, {},
     KUBESHARE_GROUP_THRESHOLD),
    ({KUBESHARE_GROUP_NAME: "j", KUBESHARE_GROUP_HEADCOUNT: "4", KUBESHARE_GROUP_THRESHOLD: "half"}, {},
     KUBESHARE_GROUP_THRESHOLD),
])
def test_bad_gang_values_are_sentences_naming_the_field(labels: dict[str, str], annotations: dict[str, str],
                                                        field: str) -> None:
    with pytest.raises(RequestError, match=field.replace(".", r"\.")) as caught:
        read_gang(grouped(labels, annotations))
    assert "team/worker-0" in str(caught.value)
    assert len(str(caught.value)) < 400  # user text is clipped


# -- the planner ---------------------------------------------------------------------------------------------------

def node(name: str, *totals: int, used: tuple[int, ...] = ()) -> Node:
    gpus = [GPU(index=i, model="T4", total=t, used=used[i] if i < len(used) else 0) for i, t in enumerate(totals)]
    return Node(name=name, gpus=gpus)


def members(*sizes: int, count: int = 1) -> list[Member]:
    policy = make_policy("binpack")
    return [Member(f"ns/m{i}", PodRequest(per_gpu=s, gpu_count=count), policy.evaluate) for i, s in enumerate(sizes)]


def test_a_gang_that_fits_is_placed_whole_and_the_nodes_are_not_touched() -> None:
    nodes = [node("a", 16, 16), node("b", 16)]
    plan = plan_gang(nodes, members(10, 10, 10), need=3)
    assert plan.fitted == 3
    assert sorted(p.node for p in plan.placed.values()) == ["a", "a", "b"]
    assert all(g.used == 0 for n in nodes for g in n.gpus) and not any(n.placements for n in nodes)


def test_a_gang_that_fits_only_in_part_gets_no_plan() -> None:
    plan = plan_gang([node("a", 16, 16, used=(8, 0))], members(10, 10, 10), need=3)
    assert plan.placed == {}
    assert plan.fitted == 1


def test_members_beyond_the_minimum_are_placed_when_they_fit() -> None:
    plan = plan_gang([node("a", 16, 16)], members(10, 10, 10), need=2)
    assert plan.fitted == 2 and len(plan.placed) == 2


def test_larger_members_go_first_so_a_mixed_gang_packs() -> None:
    # GPU 0 has 16 units free, GPU 1 has 12. In arrival order binpack puts the 4 on the tighter GPU 1, a 12 on
    # GPU 0, and the other 12 fits nowhere; largest first, both 12s fit and the 4 joins one of them.
    plan = plan_gang([node("a", 16, 16, used=(0, 4))], members(4, 12, 12), need=3)
    assert plan.fitted == 3


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(1, 16), min_size=1, max_size=4), min_size=1, max_size=4),
       st.lists(st.tuples(st.integers(1, 16), st.integers(1, 2)), min_size=1, max_size=6),
       st.integers(0, 6), st.sampled_from(["binpack", "spread", "fgd"]))
def test_a_plan_is_never_over_capacity_and_is_all_it_needs_or_nothing(
        layout: list[list[int]], wanted: list[tuple[int, int]], need: int, policy_name: str) -> None:
    nodes = [node(f"n{i}", *totals) for i, totals in enumerate(layout)]
    policy = make_policy(policy_name)
    gang = [Member(f"ns/m{i}", PodRequest(per_gpu=size, gpu_count=count), policy.evaluate)
            for i, (size, count) in enumerate(wanted)]
    need = min(need, len(gang))
    plan = plan_gang(nodes, gang, need)
    assert plan.placed == {} or len(plan.placed) >= need
    assert plan.placed or plan.fitted < need or need == 0
    free = {(n.name, g.index): g.total for n in nodes for g in n.gpus}
    requests = {m.key: m.request for m in gang}
    for key, where in plan.placed.items():
        assert len(set(where.gpus)) == requests[key].gpu_count
        for index in where.gpus:
            free[(where.node, index)] -= requests[key].per_gpu
    assert all(left >= 0 for left in free.values())


def naive_plan(nodes: list[Node], gang: list[Member], seed: int = 0) -> dict[str, Placed]:
    """The planner's rule without its shortcuts: every member asks every node afresh."""
    copies = [n.copy() for n in nodes]
    placed: dict[str, Placed] = {}
    for member in sorted(gang, key=lambda m: (-m.request.total, -m.request.gpu_count, m.key)):
        options = [(c.score, node_priority(n.name, seed), n, c) for n in copies
                   if (c := member.evaluate(n, member.request)) is not None]
        if options:
            _, _, node, candidate = max(options, key=lambda o: o[:2])
            node.place(member.key, member.request, candidate.gpus)
            placed[member.key] = Placed(node.name, candidate.gpus)
    return placed


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(1, 16), min_size=1, max_size=3), min_size=1, max_size=5),
       st.lists(st.tuples(st.integers(1, 16), st.integers(1, 2), st.sampled_from(["binpack", "spread", "fgd"])),
                min_size=1, max_size=6))
def test_the_planner_decides_as_if_every_member_asked_every_node(layout: list[list[int]],
                                                                 wanted: list[tuple[int, int, str]]) -> None:
    # Identical nodes (judged once per state) and repeated shapes (judged once, then only the changed node).
    nodes = [node(f"n{i}", *totals) for i, totals in enumerate(layout + layout)]
    policies = {name: make_policy(name) for name in ("binpack", "spread", "fgd")}
    gang = [Member(f"ns/m{i}", PodRequest(per_gpu=size, gpu_count=count), policies[name].evaluate)
            for i, (size, count, name) in enumerate(wanted)]
    assert plan_gang(nodes, gang, need=0).placed == naive_plan(nodes, gang)


# -- the cache's holds ------------------------------------------------------------------------------------------

INVENTORY = '[{"index":0,"model":"T4","memoryMiB":16384},{"index":1,"model":"T4","memoryMiB":16384}]'


def cache_with(*names: str) -> ClusterCache:
    cache = ClusterCache()
    for name in names:
        cache.upsert_node(NodeInfo(name=name, annotations={"gpushare.io/gpu-inventory": INVENTORY}))
    return cache


def test_a_gang_hold_is_all_members_or_none() -> None:
    cache = cache_with("a", "b")
    ten = PodRequest(per_gpu=10)
    with pytest.raises(ReservationError, match="no room"):
        cache.hold_gang("ns/g", {"ns/m0": ("u0", ten, "a", (0,)), "ns/m1": ("u1", ten, "b", (0,)),
                                 "ns/m2": ("u2", ten, "a", (0,))})
    assert cache.reservations() == 0
    assert all(g.used == 0 for n in cache.snapshot(["a", "b"]) for g in n.gpus)
    cache.hold_gang("ns/g", {"ns/m0": ("u0", ten, "a", (0,)), "ns/m1": ("u1", ten, "b", (0,))})
    assert {r.pod_key for r in cache.gang_holds("ns/g")} == {"ns/m0", "ns/m1"}
    assert cache.held_gangs() == {"ns/g"}
    held = cache.gang_hold("ns/m0")
    assert held is not None and held.node == "a" and held.placement.gpu_indices == (0,)
    # Nothing else can take the held memory: a 10-unit pod fits only on the GPUs left free.
    assert cache.filter(["a", "b"], ten).passed == ["a", "b"]
    assert cache.filter(["a", "b"], PodRequest(per_gpu=10, gpu_count=2)).passed == []
    cache.release(held)
    assert cache.gang_hold("ns/m0") is None
    assert cache.filter(["a", "b"], PodRequest(per_gpu=10, gpu_count=2)).passed == ["a"]


def test_a_hold_gives_way_to_the_pod_bound_on_other_gpus_and_survives_pending_updates() -> None:
    # With several replicas the leader binds a held member with GPUs of its own choosing on the planned node.
    cache = cache_with("a")
    cache.hold_gang("ns/g", {"ns/m0": ("u0", PodRequest(per_gpu=10), "a", (0,))})
    pending = PodInfo(namespace="ns", name="m0", uid="u0", labels={LABEL_POD_GROUP: "g"})
    cache.upsert_pod(pending)  # a status update while it waits: the hold stays
    assert cache.gang_hold("ns/m0") is not None
    assignment = Assignment(gpu_indices=(1,), total=10, gpu_memory=16, assume_time_ns=1, unit=MemoryUnit.GiB)
    cache.upsert_pod(replace(pending, node_name="a", annotations=assignment.annotations()))
    assert cache.gang_hold("ns/m0") is None and cache.gang_holds("ns/g") == []
    [node] = cache.snapshot(["a"])
    assert [g.used for g in node.gpus] == [0, 10]


def test_a_deleted_member_gives_its_hold_back() -> None:
    cache = cache_with("a")
    cache.hold_gang("ns/g", {"ns/m0": ("u0", PodRequest(per_gpu=10), "a", (0,))})
    cache.delete_pod(PodInfo(namespace="ns", name="m0", uid="u0"))
    assert cache.reservations() == 0
    assert [g.used for g in cache.snapshot(["a"])[0].gpus] == [0, 0]
