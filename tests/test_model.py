"""The cluster model: accounting pods on GPUs, and what fits where."""

from __future__ import annotations

import pytest

from gpushare import contract
from gpushare.contract import GPUInventoryEntry, MemoryUnit, ModelRule, NodeInfo, PodInfo, PodRequest
from gpushare.model import GPU, Node, build_node


def node(*totals: int, model: str = "T4", cpu: int = 0) -> Node:
    return Node(name="n", gpus=[GPU(index=i, model=model, total=t) for i, t in enumerate(totals)], cpu_milli=cpu)


def test_place_and_remove_restore_the_gpu() -> None:
    n = node(16, 16)
    n.place("ns/a", PodRequest(per_gpu=6), [1])
    assert [g.used for g in n.gpus] == [0, 6]
    n.remove("ns/a")
    assert [(g.used, g.holders) for g in n.gpus] == [(0, 0), (0, 0)]


def test_strict_place_refuses_to_overcommit() -> None:
    n = node(8)
    n.place("ns/a", PodRequest(per_gpu=6), [0])
    with pytest.raises(ValueError, match="has no room"):
        n.place("ns/b", PodRequest(per_gpu=3), [0])
    with pytest.raises(ValueError, match="has no GPU 4"):
        n.place("ns/c", PodRequest(per_gpu=1), [4])


def test_exclusive_pods_hold_the_whole_gpu() -> None:
    n = node(16, 16)
    n.place("ns/x", PodRequest(per_gpu=1, exclusive=True), [0])
    assert n.gpus[0].free == 0
    assert [g.index for g in n.hosts(PodRequest(per_gpu=1))] == [1]
    n.place("ns/y", PodRequest(per_gpu=1), [1])
    assert not n.fits(PodRequest(per_gpu=1, exclusive=True))


def test_compute_share_is_guaranteed() -> None:
    n = node(16)
    n.place("ns/a", PodRequest(per_gpu=1, compute_percent=70), [0])
    assert not n.fits(PodRequest(per_gpu=1, compute_percent=40))
    assert n.fits(PodRequest(per_gpu=1, compute_percent=30))


def test_cpu_is_a_hard_limit_when_known() -> None:
    n = node(16, cpu=4000)
    assert not n.fits(PodRequest(per_gpu=1, cpu_milli=5000))
    assert n.unresolvable_reason(PodRequest(per_gpu=1, cpu_milli=5000)) is not None


def test_unresolvable_reasons_name_the_cause() -> None:
    n = node(16, 16)
    wrong_model = PodRequest(per_gpu=1, models=ModelRule(("a100",)))
    assert "no GPU of model one of a100" in str(n.unresolvable_reason(wrong_model))
    assert "largest GPU has 16" in str(n.unresolvable_reason(PodRequest(per_gpu=20)))
    assert n.unresolvable_reason(PodRequest(per_gpu=8, gpu_count=2)) is None
    assert "needs 3" in str(n.unresolvable_reason(PodRequest(per_gpu=8, gpu_count=3)))


def test_mixed_models_get_their_own_memory_from_the_inventory() -> None:
    inventory = contract.encode_inventory([GPUInventoryEntry(0, "Tesla-T4", 15360),
                                           GPUInventoryEntry(1, "A100-80GB", 81920)])
    info = NodeInfo(name="n", annotations={contract.ANN_NODE_INVENTORY: inventory},
                    capacity={contract.RESOURCE_GPU_MEM: "95", contract.RESOURCE_GPU_COUNT: "2"})
    built = build_node(info, MemoryUnit.GiB)
    assert [(g.model, g.total) for g in built.gpus] == [("Tesla-T4", 15), ("A100-80GB", 80)]


def test_nodes_without_inventory_fall_back_to_capacity_over_count() -> None:
    info = NodeInfo(name="n", labels={"nvidia.com/gpu.product": "Tesla-V100"},
                    capacity={contract.RESOURCE_GPU_MEM: "32", contract.RESOURCE_GPU_COUNT: "2"})
    built = build_node(info, MemoryUnit.GiB)
    assert [(g.model, g.total) for g in built.gpus] == [("Tesla-V100", 16), ("Tesla-V100", 16)]


def test_build_node_counts_only_active_pods_bound_here() -> None:
    info = NodeInfo(name="n", capacity={contract.RESOURCE_GPU_MEM: "16", contract.RESOURCE_GPU_COUNT: "1"},
                    allocatable={"cpu": "8", "memory": "32Gi"})

    def bound(name: str, units: int, **kw: object) -> PodInfo:
        ann = {contract.ANN_IDX: "0", contract.ANN_POD: str(units)}
        fields: dict[str, object] = {"node_name": "n", "phase": "Running"}
        fields.update(kw)
        return PodInfo(namespace="ns", name=name, annotations=ann, **fields)  # type: ignore[arg-type]

    pods = [bound("running", 4), bound("done", 5, phase="Succeeded"), bound("going", 6, deleting=True),
            bound("elsewhere", 7, node_name="m")]
    built = build_node(info, MemoryUnit.GiB, pods)
    assert built.gpus[0].used == 4
    assert list(built.placements) == ["ns/running"]
    assert built.cpu_milli == 8000 and built.memory_mib == 32768


def test_sharing_counts_stay_on_their_gpu_though_gpus_without_any_share_one_empty_mapping() -> None:
    a, b = node(16, 16), node(16)
    assert a.gpus[0].affinity is b.gpus[0].exclusion  # one shared empty mapping: 2 kB less per node
    a.place("ns/p", PodRequest(per_gpu=4, sharing=contract.Sharing(affinity="x", anti_affinity="y",
                                                                  exclusion="z")), [1])
    assert (a.gpus[1].affinity, a.gpus[1].anti_affinity, a.gpus[1].exclusion) == ({"x": 1}, {"y": 1}, {"z": 1})
    others = [a.gpus[0], b.gpus[0]]
    assert all(not (g.affinity or g.anti_affinity or g.exclusion or g.links) for g in others)
    a.remove("ns/p")
    assert not (a.gpus[1].affinity or a.gpus[1].anti_affinity or a.gpus[1].exclusion)


def test_a_copy_holds_every_field_and_changes_apart_from_the_original() -> None:
    gpu = GPU(index=3, model="A100", total=40, used=7, compute_used=30, holders=2, numa=1, links={2: 12},
              uuid="GPU-x", affinity={"a": 1}, anti_affinity={"b": 2}, exclusion={"c": 1})
    node = Node("n1", [gpu], cpu_milli=8000, memory_mib=1024, cpu_used=500, memory_used=64,
                unit=MemoryUnit.MiB, defect="odd")
    node.place("default/p", PodRequest(per_gpu=5), [3])
    copy = node.copy()
    assert copy == node and copy.gpus[0] is not gpu and copy.placements is not node.placements
    copy.place("default/q", PodRequest(per_gpu=5), [3])
    copy.gpus[0].healthy = False
    assert (gpu.used, gpu.healthy) == (12, True) and list(node.placements) == ["default/p"]
