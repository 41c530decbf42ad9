"""fgd-scarcity: model pressure from the learned demand and the cluster's capacity, the node-size reserve, the
balance of cores to GPUs, and where they send pods."""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.contract import ModelRule, PodRequest
from gpushare.model import GPU, Node, gpu_capacity, state_signature
from gpushare.policies import choose_node, make_policy, node_priority
from gpushare.policies.base import Candidate, ClusterAware, InventoryAware, policy_version
from gpushare.policies.lookahead import FragmentationLookahead
from gpushare.policies.scarcity import (
    RESERVE_DEPTH,
    RESERVE_LEVELS,
    ScarcityLookahead,
    copies,
    cores_per_unit,
    demand_beyond,
    model_pressure,
    stranded,
    surely_unneeded,
)
from gpushare.policies.workload import Shape, WorkloadDistribution

T4_ONLY = ModelRule(("t4",))


def test_pressure_is_constrained_demand_over_the_capacity_it_may_use() -> None:
    capacity = {"G2": 7000, "T4": 2000, "P100": 1000}
    histogram = {Shape(1, 1000): 0.5, Shape(1, 1000, models=T4_ONLY): 0.25,
                 Shape(1, 500, models=ModelRule(("t4", "p100"))): 0.25}
    pressure = model_pressure(histogram, capacity)
    # GPU demand 875 per pod: T4-only 250 of it on a fifth of the capacity, T4|P100 125 on three tenths.
    assert pressure["T4"] == 1.0 == min(1.0, (2 / 7) / 0.2 + (1 / 7) / 0.3)
    assert pressure["P100"] == pytest.approx((1 / 7) / 0.3)
    assert pressure["G2"] == 0.0
    assert model_pressure({Shape(1, 1000): 1.0}, capacity) == dict.fromkeys(capacity, 0.0)
    assert model_pressure(histogram, {}) == {}


def test_flexible_pods_leave_the_scarce_model_to_the_pods_that_need_it() -> None:
    workload = WorkloadDistribution()
    workload.seed({Shape(1, 1000, 4000): 1.0, Shape(1, 1000, 4000, models=T4_ONLY): 1.0}, observations=100)
    t4 = Node("t4", [GPU(0, "T4", 1000), GPU(1, "T4", 1000)], cpu_milli=64000)
    g2 = Node("g2", [GPU(0, "G2", 1000), GPU(1, "G2", 1000)], cpu_milli=64000)
    nodes = [t4, g2, *(Node(f"g2-{i}", [GPU(0, "G2", 1000), GPU(1, "G2", 1000)], cpu_milli=64000)
                       for i in range(3))]
    flexible = PodRequest(per_gpu=1000, gpu_count=1, cpu_milli=4000)
    policy = ScarcityLookahead(workload)
    assert isinstance(policy, InventoryAware)
    policy.observe_inventory(gpu_capacity(nodes))
    # Node priority alone would pick the T4 node for some seeds; the pressure on T4 never lets it.
    for seed in range(20):
        chosen = choose_node([t4, g2], flexible, policy, seed)
        assert chosen is not None and chosen[0].name == "g2"
    constrained = PodRequest(per_gpu=1000, gpu_count=1, cpu_milli=4000, models=T4_ONLY)
    chosen = choose_node([t4, g2], constrained, policy)
    assert chosen is not None and chosen[0].name == "t4"


def test_without_constrained_demand_or_starved_nodes_it_decides_as_fgd_lookahead() -> None:
    workload = WorkloadDistribution()
    workload.seed({Shape(1, 500, 2000): 3.0, Shape(2, 1000, 8000): 1.0, Shape(0, 0, 6000): 1.0}, observations=50)
    nodes = [Node("a", [GPU(0, "G2", 1000, used=300, holders=1), GPU(1, "G2", 1000)], cpu_milli=32000),
             Node("b", [GPU(0, "T4", 1000), GPU(1, "T4", 1000)], cpu_milli=96000, cpu_used=40000)]
    scarcity, lookahead = ScarcityLookahead(workload), FragmentationLookahead(workload)
    scarcity.observe_inventory(gpu_capacity(nodes))
    for request in (PodRequest(per_gpu=500, gpu_count=1, cpu_milli=2000), PodRequest(per_gpu=1000, gpu_count=2),
                    PodRequest(per_gpu=0, gpu_count=0, cpu_milli=6000)):
        for node in nodes:
            assert scarcity.evaluate(node, request) == lookahead.evaluate(node, request)


def test_the_version_changes_with_the_inventory_and_the_workload() -> None:
    policy = make_policy("fgd-scarcity")
    assert isinstance(policy, ScarcityLookahead)
    first = policy.version
    policy.observe_inventory({"T4": 2000})
    second = policy.version
    policy.observe_inventory({"T4": 2000})
    assert second != first and policy.version == second, "an unchanged inventory keeps the scores"
    policy.observe(PodRequest(per_gpu=1000, gpu_count=1, models=T4_ONLY))
    assert policy.version != second


def test_the_capacity_counts_healthy_gpus_per_model() -> None:
    nodes = [Node("a", [GPU(0, "T4", 1000), GPU(1, "T4", 1000, healthy=False)]),
             Node("b", [GPU(0, "G2", 16), GPU(1, "G2", 16)])]
    assert gpu_capacity(nodes) == {"T4": 1000, "G2": 32}


def test_a_model_is_charged_from_the_first_pod_in_proportion_to_its_pressure() -> None:
    # T4-only pods are 15% of the GPU demand and T4 a fifth of the capacity: pressure 0.75 on T4.
    workload = WorkloadDistribution()
    workload.seed({Shape(1, 1000, 4000): 0.85, Shape(1, 1000, 4000, models=T4_ONLY): 0.15}, observations=100)
    t4 = Node("t4", [GPU(0, "T4", 1000), GPU(1, "T4", 1000)], cpu_milli=64000)
    nodes = [t4, *(Node(f"g2-{i}", [GPU(0, "G2", 1000), GPU(1, "G2", 1000)], cpu_milli=64000) for i in range(4))]
    policy, lookahead = ScarcityLookahead(workload), FragmentationLookahead(workload)
    policy.observe_inventory(gpu_capacity(nodes))
    assert isinstance(policy, ClusterAware)
    policy.observe_nodes(nodes)
    flexible = PodRequest(per_gpu=1000, gpu_count=1, cpu_milli=4000)
    t4_only = PodRequest(per_gpu=1000, gpu_count=1, cpu_milli=4000, models=T4_ONLY)
    g2 = nodes[1]
    # Every T4 GPU is still free, and a flexible pod taking one already pays 0.75 of its 1,000 units: a G2 node
    # does not charge, and a pod that can run only on T4 pays the same wherever it goes.
    for node in (t4, g2):
        charged, plain = policy.evaluate(node, flexible), lookahead.evaluate(node, flexible)
        assert charged is not None and plain is not None
        # The lookahead's node score is in steps of 100 units (a tenth of the largest share).
        assert plain.score - charged.score == pytest.approx(750 if node is t4 else 0, abs=50)
    charged, plain = policy.evaluate(t4, t4_only), lookahead.evaluate(t4, t4_only)
    assert charged is not None and plain is not None
    assert plain.score - charged.score == pytest.approx(750, abs=50)
    assert all(choose_node(nodes, flexible, policy, seed)[0].name != "t4"  # type: ignore[index]
               for seed in range(10))
    # Taking T4 GPUs moves no charge (the pressure is learned from the pods, not from what is free).
    before = policy.version
    t4.place("first", flexible, [0])
    policy.observe_nodes([t4])
    assert policy.version == before


def big_node(name: str) -> Node:
    return Node(name, [GPU(i, "G3", 1000) for i in range(8)], cpu_milli=128000)


def small_node(name: str) -> Node:
    return Node(name, [GPU(i, "G2", 1000) for i in range(8)], cpu_milli=96000)


def reserve_cluster() -> list[Node]:
    return [big_node("big-0"), big_node("big-1"), *(small_node(f"small-{i}") for i in range(14))]


def test_the_last_nodes_a_large_shape_fits_are_kept_for_it_while_it_is_expected() -> None:
    # One pod in 200 asks for eight GPUs and 120 cores: only the two 128-core nodes can hold it. Too rare for the
    # lookahead's measure to see, yet 128 free GPUs may still bring two of them (Poisson mean 0.62, P(>= 2) 13%).
    large, cpu_heavy = Shape(8, 1000, 120000), Shape(1, 1000, 12000)
    expecting = WorkloadDistribution(coverage=1.0)
    expecting.seed({large: 1.0, cpu_heavy: 199.0}, observations=100)
    pod = PodRequest(per_gpu=1000, gpu_count=1, cpu_milli=12000)
    nodes = reserve_cluster()
    policy = ScarcityLookahead(expecting)
    policy.observe_inventory(gpu_capacity(nodes))
    policy.observe_nodes(nodes)
    # Tie seeds under which a large node comes first in node priority.
    seeds = [s for s in range(100) if max(nodes, key=lambda n: node_priority(n.name, s)).name.startswith("big")]
    assert seeds
    lookahead = FragmentationLookahead(expecting)
    for seed in seeds[:5]:
        kept, plain = choose_node(nodes, pod, policy, seed), choose_node(nodes, pod, lookahead, seed)
        assert kept is not None and kept[0].name.startswith("small")
        # The lookahead alone ties every node, and the tie goes to the large one.
        assert plain is not None and plain[0].name.startswith("big")
    # Once the large pods are no longer expected to need both nodes, the reserve lets go.
    rare = WorkloadDistribution(coverage=1.0)
    rare.seed({large: 1.0, cpu_heavy: 4000.0}, observations=100)
    policy = ScarcityLookahead(rare)
    policy.observe_inventory(gpu_capacity(nodes))
    policy.observe_nodes(nodes)
    big = nodes[0]
    assert policy.evaluate(big, pod) == FragmentationLookahead(rare).evaluate(big, pod)


def test_the_reserve_follows_the_nodes_observed_and_forgets_those_gone() -> None:
    large = Shape(8, 1000, 120000)
    workload = WorkloadDistribution(coverage=1.0)
    workload.seed({large: 1.0, Shape(1, 1000, 12000): 199.0}, observations=100)
    nodes = reserve_cluster()
    policy = ScarcityLookahead(workload)
    policy.observe_inventory(gpu_capacity(nodes))
    policy.observe_nodes(nodes)
    pod = PodRequest(per_gpu=1000, gpu_count=1, cpu_milli=12000)
    # Nodes of one size share the record of their GPUs (a cluster has thousands of nodes and few sizes).
    sizes = policy._sizes
    assert sizes["small-0"][1] is sizes["small-13"][1] and sizes["big-0"][1] is sizes["big-1"][1]
    big = nodes[0]
    kept = policy.evaluate(big, pod)
    version = policy.version
    policy.observe_nodes(nodes[2:3])
    assert policy.version == version, "a node observed again unchanged keeps every score"
    # The other large node is taken: this one is the last, and the chance that it is needed rises.
    other = nodes[1]
    other.place("cpu-only", PodRequest(per_gpu=0, gpu_count=0, cpu_milli=64000), [])
    policy.observe_nodes([other])
    last = policy.evaluate(big, pod)
    assert kept is not None and last is not None and last.score < kept.score
    policy.observe_nodes([], gone=["big-1", "big-0"])
    assert policy.evaluate(big, pod) == FragmentationLookahead(workload).evaluate(big, pod), \
        "no large node left in the cluster: nothing to keep"


def test_copies_count_gpus_and_cpu_and_the_chance_of_demand_beyond_is_poisson() -> None:
    node = big_node("big")
    assert copies(node, Shape(8, 1000, 120000)) == 1
    assert copies(node, Shape(8, 1000, 120000), cpu_taken=9000) == 0
    assert copies(node, Shape(8, 1000, 120000), taken={3: 100}) == 0
    assert copies(node, Shape(1, 400, 10000)) == 12  # 16 shares of 400 on 8 GPUs, but 128 cores for 12
    assert copies(node, Shape(1, 400, 0, models=T4_ONLY)) == 0
    assert demand_beyond(2.0, 3, depth=5) == pytest.approx(
        (1 - math.exp(-2) * (1 + 2 + 2), 1 - math.exp(-2) * (1 + 2), 1 - math.exp(-2), 1.0, 1.0))
    assert demand_beyond(0.0, 1, depth=2) == (0.0, 1.0)
    assert demand_beyond(900.0, 10) == pytest.approx((1.0,)), "a large mean must not underflow"


def test_a_cpu_heavy_pod_is_kept_off_a_node_whose_gpus_it_would_leave_without_cores() -> None:
    # The GPU work to come brings 8 millicores per unit: a 4-GPU node with 32 cores feeds all its GPUs, until a
    # 12-core pod takes one GPU and leaves 20 cores for three (2,500 units fed, 500 stranded).
    light, heavy = Shape(1, 1000, 4000), Shape(1, 1000, 12000)
    workload = WorkloadDistribution(coverage=1.0)
    workload.seed({light: 1.0, heavy: 1.0}, observations=100)
    assert cores_per_unit(workload.histogram()) == pytest.approx(8.0)
    starved = Node("starved", [GPU(i, "V100M16", 1000) for i in range(4)], cpu_milli=32000)
    rich = Node("rich", [GPU(i, "G3", 1000) for i in range(8)], cpu_milli=128000)
    policy, lookahead = ScarcityLookahead(workload), FragmentationLookahead(workload)
    pod = PodRequest(per_gpu=1000, gpu_count=1, cpu_milli=12000)
    # Shape by shape the lookahead sees no difference, and node priority sends the pod to the starved node.
    seeds = [s for s in range(50) if choose_node([starved, rich], pod, lookahead, s)[0].name == "starved"]  # type: ignore[index]
    assert seeds
    for seed in seeds:
        chosen = choose_node([starved, rich], pod, policy, seed)
        assert chosen is not None and chosen[0].name == "rich"
    # A pod with fewer cores per unit than the workload's neither pays nor gains, on a starved node as elsewhere.
    frugal = PodRequest(per_gpu=1000, gpu_count=1, cpu_milli=4000)
    assert policy.evaluate(starved, frugal) == lookahead.evaluate(starved, frugal)
    # A pod without GPUs pays no balance: the lookahead already counts the copies its cores take from the GPU shapes.
    cpu_only = PodRequest(per_gpu=0, gpu_count=0, cpu_milli=12000)
    assert policy.evaluate(starved, cpu_only) == lookahead.evaluate(starved, cpu_only)


def test_stranded_memory_is_the_idle_memory_the_free_cores_cannot_feed() -> None:
    assert stranded(3000, 20000, 8.0) == pytest.approx(500.0)
    assert stranded(3000, 32000, 8.0) == 0.0
    assert stranded(3000, 0, 0.0) == 0.0, "without GPU work to come nothing is stranded"
    # CPU-only shapes feed no GPU memory, so they are left out of the rate.
    assert cores_per_unit({Shape(1, 500, 6000): 0.5, Shape(0, 0, 32000): 0.5}) == pytest.approx(12.0)
    assert cores_per_unit({Shape(0, 0, 32000): 1.0}) == 0.0


def _reference_demand_beyond(mean: float, hosts: int, depth: int) -> tuple[float, ...]:
    """The Poisson tail as a plain loop over every term, the arithmetic ``demand_beyond`` must match bit for bit."""
    below = [0.0]
    if mean > 0:
        for k in range(max(hosts, 0)):
            below.append(below[-1] + math.exp(k * math.log(mean) - mean - math.lgamma(k + 1)))
    return tuple(1.0 if hosts - i <= 0 else 0.0 if mean <= 0 else max(0.0, 1.0 - below[hosts - i])
                 for i in range(depth))


@settings(max_examples=400, deadline=None)
@given(mean=st.one_of(st.floats(0.0, 3000.0), st.sampled_from([0.0, 1e-300, 0.5, 40.0, 900.0])),
       hosts=st.integers(-3, 2500), depth=st.integers(1, 9))
def test_demand_beyond_has_the_bits_of_the_sum_over_every_term(mean: float, hosts: int, depth: int) -> None:
    """Reserve prices are rounded to eighths: a last bit of difference could move one and with it a placement."""
    assert demand_beyond(mean, hosts, depth) == _reference_demand_beyond(mean, hosts, depth)


@settings(max_examples=600, deadline=None)
@given(mean=st.one_of(st.floats(0.0, 3000.0), st.sampled_from([0.0, 1e-300, 0.5, 40.0, 900.0])),
       hosts=st.integers(-3, 4000))
def test_a_reserve_said_to_be_surely_unneeded_has_no_price(mean: float, hosts: int) -> None:
    """The bound that spares a reprice the Poisson sums only ever skips a reserve the sums leave unpriced."""
    if surely_unneeded(mean, hosts):
        assert round(demand_beyond(mean, hosts, RESERVE_DEPTH)[0] * RESERVE_LEVELS) == 0


def test_the_bound_settles_the_reserves_far_from_needed() -> None:
    assert surely_unneeded(5.0, 40) and surely_unneeded(0.0, 3) and surely_unneeded(300.0, 420)
    # Near the mean, or with no place left, the sums decide.
    assert not surely_unneeded(5.0, 9) and not surely_unneeded(300.0, 330) and not surely_unneeded(5.0, 0)


def _priced_cluster() -> tuple[list[Node], WorkloadDistribution]:
    """Three models, one pressed by pods that accept only it, and two large nodes kept for a rare shape."""
    nodes = [Node(f"t4-{i}", [GPU(g, "T4", 1000) for g in range(2)], cpu_milli=64000) for i in range(4)]
    nodes += [big_node("big-0"), big_node("big-1")]
    nodes += [small_node(f"g2-{i}") for i in range(6)]  # eight GPUs, too few cores for the rare shape
    workload = WorkloadDistribution(coverage=1.0)
    workload.seed({Shape(1, 1000, 4000): 4.0, Shape(1, 500, 2000, models=T4_ONLY): 0.5,
                   Shape(8, 1000, 120000): 0.05, Shape(1, 300, 1000): 2.0}, observations=1000)
    return nodes, workload


def _carried_answers_hold(order: list[tuple[int, int, int]]) -> int:
    """Place pods as ``order`` says (node, units, millicores) and check, before each, that every node whose answers
    ``unchanged_since`` carries over from an earlier version answers as it did then; how many were carried."""
    nodes, workload = _priced_cluster()
    policy = ScarcityLookahead(workload)
    policy.observe_inventory(gpu_capacity(nodes))
    policy.observe_nodes(nodes)
    requests = [PodRequest(per_gpu=500, gpu_count=1, cpu_milli=2000), PodRequest(per_gpu=1000, gpu_count=2),
                PodRequest(per_gpu=300, gpu_count=1, cpu_milli=1000, models=T4_ONLY)]
    # (version, node name, the node's state) -> each request's answer then.
    answered: dict[tuple[int, str, Hashable], list[Candidate | None]] = {}
    carried = 0
    for step, (index, units, cpu) in enumerate(order):
        version = policy.version
        for node in nodes:
            answered[(version, node.name, state_signature(node))] = [policy.evaluate(node, r) for r in requests]
        by_name = {node.name: node for node in nodes}
        for (then, name, state), answers in answered.items():
            node = by_name[name]
            if then < version and state == state_signature(node) and policy.unchanged_since(then, node):
                carried += 1
                assert [policy.evaluate(node, r) for r in requests] == answers, (then, version, name)
        node = nodes[index]
        free = [g.index for g in node.gpus if g.free >= units]
        if free and node.cpu_milli - node.cpu_used >= cpu:
            node.place(f"pod-{step}", PodRequest(per_gpu=units, gpu_count=1, cpu_milli=cpu), free[:1])
            policy.observe_nodes([node])
    return carried


@settings(max_examples=40, deadline=None)
@given(order=st.lists(st.tuples(st.integers(0, 11), st.sampled_from([100, 300, 500, 1000]),
                                st.integers(0, 40000)), min_size=0, max_size=30),
       shares=st.lists(st.integers(0, 1000), min_size=2, max_size=10), reserved=st.booleans())
def test_with_prices_and_reserves_a_pod_that_asks_for_more_cpu_never_scores_higher(
        order: list[tuple[int, int, int]], shares: list[int], reserved: bool) -> None:
    """fgd-scarcity's displacements (a model's charge, a reserve's copies lost, the cores a node's idle GPUs are
    left) grow with the CPU a pod takes, so its score never rises with it (``Policy.evaluate``), on a cluster whose
    models are priced or whose large nodes are kept for a rare shape; the CPU asked is each of ``shares``
    (thousandths) of what a node has free."""
    nodes, workload = _priced_cluster()
    if reserved:  # as in test_the_last_nodes_a_large_shape_fits_are_kept_for_it_while_it_is_expected
        nodes, workload = reserve_cluster()[:12], WorkloadDistribution(coverage=1.0)
        workload.seed({Shape(8, 1000, 120000): 1.0, Shape(1, 1000, 12000): 199.0}, observations=100)
    policy = ScarcityLookahead(workload)
    policy.observe_inventory(gpu_capacity(nodes))
    for i, (index, units, cpu) in enumerate(order):
        node = nodes[index]
        free = [g.index for g in node.gpus if g.free >= units]
        if free and node.cpu_milli - node.cpu_used >= cpu:
            node.place(f"pod-{i}", PodRequest(per_gpu=units, gpu_count=1, cpu_milli=cpu), free[:1])
    policy.observe_nodes(nodes)
    for shape in (PodRequest(per_gpu=500, gpu_count=1), PodRequest(per_gpu=1000, gpu_count=2),
                  PodRequest(per_gpu=300, gpu_count=1, models=T4_ONLY), PodRequest(per_gpu=1000, gpu_count=8),
                  PodRequest(per_gpu=0, gpu_count=0)):
        for node in nodes:
            scores = [c.score for c in (policy.evaluate(node, replace(shape, cpu_milli=cpu))
                                        for cpu in sorted({(node.cpu_milli - node.cpu_used) * share // 1000
                                                           for share in shares}))
                      if c is not None]
            assert scores == sorted(scores, reverse=True), (node.name, shape)


@settings(max_examples=30, deadline=None)
@given(order=st.lists(st.tuples(st.integers(0, 11), st.sampled_from([100, 300, 500, 1000]),
                                st.integers(0, 16000)), min_size=5, max_size=40))
def test_a_node_the_prices_since_a_version_did_not_touch_is_answered_as_it_was_then(
        order: list[tuple[int, int, int]]) -> None:
    """What ``unchanged_since`` lets the extender carry over from an earlier version must be what the policy
    answers now: for every node and request, whenever it says so, the answer is the one given at that version."""
    _carried_answers_hold(order)


def test_answers_are_carried_over_while_the_nodes_fill_and_prices_move() -> None:
    """The same check on a fixed order that fills the T4 nodes and takes from the large nodes, moving the price
    of their reserve: the other nodes carry over."""
    order = [(i % 4, 1000, 4000) for i in range(8)] + [(6 + i % 6, 500, 2000) for i in range(12)]
    order += [(4 + i % 2, 1000, 30000) for i in range(4)] + [(6 + i % 6, 1000, 8000) for i in range(30)]
    assert _carried_answers_hold(order) > 0


def test_a_price_that_moves_leaves_the_nodes_of_other_models_and_outside_the_reserves_unchanged() -> None:
    nodes, workload = _priced_cluster()
    policy = ScarcityLookahead(workload)
    policy.observe_inventory(gpu_capacity(nodes))
    policy.observe_nodes(nodes)
    t4, big, g2 = nodes[0], nodes[4], nodes[6]
    before = policy.version
    # Pods take from the large nodes until the reserve kept there for the rare shape is priced: a price-only change.
    for i in range(2):
        node = nodes[4 + i]
        node.place(f"large-{i}", PodRequest(per_gpu=1000, gpu_count=1, cpu_milli=30000), [0])
        policy.observe_nodes([node])
    assert policy.version != before
    assert not policy.unchanged_since(before, big), "the reserve's price moved"
    assert policy.unchanged_since(before, g2) and policy.unchanged_since(before, t4), "no T4 or G2 price moved"
    # Learning a new workload moves every node's answers.
    learned = policy.version
    for _ in range(2000):
        workload.observe(Shape(2, 700, 9000))
    assert policy.version != learned
    assert not policy.unchanged_since(learned, g2)


def sized_node(name: str, size: int) -> Node:
    """One of four node sizes: 8 G3 GPUs and 128 cores, 8 G2 and 96 cores, 4 G2 and 32 cores, 4 T4 and 48 cores."""
    model, gpus, cores = [("G3", 8, 128), ("G2", 8, 96), ("G2", 4, 32), ("t4", 4, 48)][size]
    return Node(name, [GPU(i, model, 1000) for i in range(gpus)], cpu_milli=cores * 1000)


LEARNED = [Shape(8, 1000, 120000), Shape(8, 1000, 64000), Shape(4, 1000, 40000), Shape(1, 1000, 12000),
           Shape(1, 500, 4000, models=T4_ONLY), Shape(2, 500, 30000), Shape(0, 0, 8000)]


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.one_of(
    st.tuples(st.just("learn"), st.integers(0, len(LEARNED) - 1), st.integers(1, 400)),
    st.tuples(st.just("resize"), st.integers(0, 7), st.integers(0, 3)),
    st.tuples(st.just("gone"), st.integers(0, 7), st.just(0)),
    st.tuples(st.just("place"), st.integers(0, 7), st.integers(1, 60))), min_size=1, max_size=12))
def test_what_the_policy_keeps_between_targets_prices_as_a_policy_that_knows_only_the_last(
        steps: list[tuple[str, int, int]]) -> None:
    """The sizes that may host each GPU demand and each reserve's counts outlive a change of target, until the
    nodes' sizes change: prices, reserves and answers after any history equal those of a policy that only saw the
    cluster and the target as they are at the end."""
    workload = WorkloadDistribution(coverage=1.0)
    workload.seed({LEARNED[0]: 1.0, LEARNED[3]: 60.0, LEARNED[6]: 20.0}, observations=100)
    # One size to start with: each resize may bring a size the policy has not seen.
    nodes = {f"n-{i}": sized_node(f"n-{i}", 1) for i in range(8)}
    policy = ScarcityLookahead(workload)

    def observed(changed: list[Node], gone: list[str]) -> None:
        policy.observe_inventory(gpu_capacity(nodes.values()))
        policy.observe_nodes(changed, gone)
        policy_version(policy)  # reprices, as the extender's catch-up does

    observed(list(nodes.values()), [])
    for step, (kind, index, value) in enumerate(steps):
        name = f"n-{index}"
        if kind == "learn":
            workload.seed({LEARNED[index]: 1.0}, observations=value)
            policy_version(policy)
        elif kind == "resize":
            nodes[name] = sized_node(name, value)
            observed([nodes[name]], [])
        elif kind == "gone" and name in nodes:
            del nodes[name]
            observed([], [name])
        elif kind == "place" and name in nodes and nodes[name].cpu_milli - nodes[name].cpu_used >= value * 1000:
            nodes[name].place(f"pod-{step}", PodRequest(per_gpu=0, gpu_count=0, cpu_milli=value * 1000), [])
            observed([nodes[name]], [])
    fresh = ScarcityLookahead(workload)
    fresh.observe_inventory(gpu_capacity(nodes.values()))
    fresh.observe_nodes(list(nodes.values()))
    policy_version(policy)
    policy_version(fresh)
    assert policy._reserves == fresh._reserves and policy._hosted == fresh._hosted
    assert policy._prices == fresh._prices
    pods = [PodRequest(per_gpu=1000, gpu_count=1, cpu_milli=12000),
            PodRequest(per_gpu=500, gpu_count=2, cpu_milli=4000)]
    for node in nodes.values():
        for pod in pods:
            assert policy.evaluate(node, pod) == fresh.evaluate(node, pod)
