"""The request semantics the policies rely on: peers' aliases, model rules, topology, unresolvable pods."""

from __future__ import annotations

import pytest

from gpushare import contract
from gpushare.contract import ContainerInfo, ModelRule, PodInfo, PodRequest, RequestError, parse_request
from gpushare.model import GPU, Node
from gpushare.policies import choose_node, make_policy, policy_names
from gpushare.policies.base import pick_gpus, topology_score


def pod(units: str = "4", count: str | None = None, annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None) -> PodInfo:
    limits = {contract.RESOURCE_GPU_MEM: units}
    if count:
        limits[contract.RESOURCE_GPU_COUNT] = count
    return PodInfo(namespace="ns", name="p", containers=(ContainerInfo(name="c", limits=limits),),
                   annotations=annotations or {}, labels=labels or {})


def test_hami_gpu_types_match_substrings_without_case() -> None:
    rule = parse_request(pod(annotations={contract.HAMI_USE_GPUTYPE: "a100, H100"})).models
    assert rule.substring
    assert rule.accepts("NVIDIA-A100-SXM4-80GB") and rule.accepts("nvidia-h100-pcie")
    assert not rule.accepts("Tesla-V100-SXM2-16GB")
    excluded = parse_request(pod(annotations={contract.HAMI_NOUSE_GPUTYPE: "T4"})).models
    assert excluded.accepts("A10") and not excluded.accepts("Tesla-T4")


def test_kubeshare_model_is_read_from_annotation_or_label() -> None:
    by_label = parse_request(pod(labels={contract.KUBESHARE_GPU_MODEL: "V100M32"})).models
    by_annotation = parse_request(pod(annotations={contract.KUBESHARE_GPU_MODEL: "V100M32"})).models
    for rule in (by_label, by_annotation):
        assert rule.accepts("v100m32") and not rule.accepts("V100M16") and not rule.substring


def test_our_model_annotation_wins_over_aliases_and_matches_exactly() -> None:
    annotations = {contract.ANN_GPU_MODEL: "V100M16|V100M32", contract.ANN_GPU_MODEL_EXCLUDE: "v100m32",
                   contract.HAMI_USE_GPUTYPE: "T4"}
    rule = parse_request(pod(annotations=annotations)).models
    assert rule == ModelRule(("v100m16", "v100m32"), ("v100m32",))
    assert rule.accepts("V100M16") and not rule.accepts("V100M32") and not rule.accepts("T4")
    assert not rule.accepts("V100M16-SXM2")
    assert ModelRule().accepts("anything")


@pytest.mark.parametrize("key", [contract.ANN_POLICY, contract.HAMI_GPU_POLICY])
def test_the_policy_override_accepts_every_registered_name(key: str) -> None:
    for name in policy_names():
        assert parse_request(pod(annotations={key: name})).policy == name
    with pytest.raises(RequestError, match="asks for placement policy 'bestfit'; use one of"):
        parse_request(pod(annotations={key: "bestfit"}))


def test_registered_policies_and_accepted_names_agree() -> None:
    assert set(policy_names()) == set(contract.POLICY_NAMES)


def nvlink_node() -> Node:
    """Four GPUs: 0-1 and 2-3 NVLinked pairs on NUMA 0 and 1; GPU 2 is the tightest."""
    gpus = [GPU(index=i, model="A100", total=80, numa=i // 2) for i in range(4)]
    gpus[0].links, gpus[1].links = {1: 100}, {0: 100}
    gpus[2].links, gpus[3].links = {3: 100}, {2: 100}
    gpus[2].used = 10
    return Node(name="n", gpus=gpus)


@pytest.mark.parametrize("name", ["binpack", "spread", "fgd", "fgd-lookahead"])
def test_multi_gpu_pods_get_nvlinked_pairs(name: str) -> None:
    policy = make_policy(name)
    policy.observe(PodRequest(per_gpu=40, gpu_count=2))
    candidate = policy.evaluate(nvlink_node(), PodRequest(per_gpu=40, gpu_count=2))
    assert candidate is not None
    assert sorted(candidate.gpus) in ([0, 1], [2, 3])


def test_topology_beats_the_policy_order_but_order_breaks_ties() -> None:
    n = nvlink_node()
    order = [n.gpus[2], n.gpus[0], n.gpus[3], n.gpus[1]]  # tightest first: 2 and 0 are not linked
    chosen = pick_gpus(n.gpus, 2, order)
    assert [g.index for g in chosen] == [2, 3]
    assert topology_score(chosen) == 100
    assert topology_score([n.gpus[0], n.gpus[2]]) == 10  # across NUMA nodes, no link


def test_unresolvable_pods_name_the_reason() -> None:
    t4 = Node(name="t4", gpus=[GPU(index=i, model="T4", total=15) for i in range(2)])
    too_big = PodRequest(per_gpu=16)
    assert "largest GPU has 15" in str(t4.unresolvable_reason(too_big))
    a100_only = PodRequest(per_gpu=4, models=ModelRule(("a100",)))
    assert "have no GPU of model one of a100 (they have T4)" in str(t4.unresolvable_reason(a100_only))
    assert choose_node([t4], a100_only, make_policy("fgd-lookahead")) is None
    assert "needs 3" in str(t4.unresolvable_reason(PodRequest(per_gpu=4, gpu_count=3)))
    assert t4.unresolvable_reason(PodRequest(per_gpu=0, gpu_count=0, cpu_milli=1000)) is None
