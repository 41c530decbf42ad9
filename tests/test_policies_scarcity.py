"""fgd-scarcity: model pressure from the learned demand and the cluster's capacity, and where it sends pods."""

from __future__ import annotations

import pytest

from gpushare.contract import ModelRule, PodRequest
from gpushare.model import GPU, Node, gpu_capacity
from gpushare.policies import choose_node, make_policy
from gpushare.policies.base import InventoryAware
from gpushare.policies.lookahead import FragmentationLookahead
from gpushare.policies.scarcity import ScarcityLookahead, model_pressure
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


def test_without_constrained_demand_or_inventory_it_decides_as_fgd_lookahead() -> None:
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
