"""The inspect report and its renderings, from plain node and pod views (no cluster)."""

from __future__ import annotations

from gpushare.contract import (
    ANN_ASSIGNED,
    ANN_MEMORY_UNIT,
    ANN_NODE_INVENTORY,
    ContainerInfo,
    GPUInventoryEntry,
    MemoryUnit,
    NodeInfo,
    PodInfo,
    PodRequest,
    encode_inventory,
    new_assignment,
)
from inspect_cli import render
from inspect_cli.report import cluster_report, is_gpushare_node, node_report


def node(name: str, mib: list[int], unit: str | None = None, **kwargs: object) -> NodeInfo:
    annotations = {ANN_NODE_INVENTORY: encode_inventory(
        GPUInventoryEntry(index=i, model="T4", memory_mib=m) for i, m in enumerate(mib))}
    if unit:
        annotations[ANN_MEMORY_UNIT] = unit
    return NodeInfo(name=name, labels={"gpushare": "true"}, annotations=annotations, addresses=("10.0.0.1",),
                    **kwargs)  # type: ignore[arg-type]


def pod(name: str, node_name: str, memory: int, gpus: tuple[int, ...] = (0,), *, assigned: bool = True,
        phase: str = "Running", deleting: bool = False) -> PodInfo:
    request = PodRequest(per_gpu=memory // len(gpus), gpu_count=len(gpus), container_shares={"main": memory})
    annotations = new_assignment(request, gpus, 0, MemoryUnit.GiB, 1).annotations()
    annotations[ANN_ASSIGNED] = str(assigned).lower()
    return PodInfo(namespace="default", name=name, node_name=node_name, phase=phase, deleting=deleting,
                   annotations=annotations,
                   containers=(ContainerInfo("main", limits={"aliyun.com/gpu-mem": str(memory)}),))


def test_gpushare_nodes_are_labelled_or_advertise_gpu_memory() -> None:
    assert is_gpushare_node(NodeInfo("a", labels={"gpushare": "true"}))
    assert is_gpushare_node(NodeInfo("b", capacity={"aliyun.com/gpu-mem": "32"}))
    assert not is_gpushare_node(NodeInfo("c", capacity={"aliyun.com/gpu-mem": "0"}))
    assert not is_gpushare_node(NodeInfo("d", capacity={"aliyun.com/gpu-mem": "lots"}))


def test_finished_terminating_and_foreign_pods_do_not_count() -> None:
    report = node_report(node("n", [16384]), [
        pod("live", "n", 4), pod("done", "n", 4, phase="Succeeded"), pod("failed", "n", 4, phase="Failed"),
        pod("leaving", "n", 4, deleting=True), pod("elsewhere", "m", 4)])
    assert [p.name for p in report.pods] == ["live"]
    assert report.allocated == 4


def test_unit_comes_from_the_node_annotation() -> None:
    report = node_report(node("n", [16160], unit="MiB"), [pod("p", "n", 1000)])
    assert (report.unit.value, report.total, report.allocated) == ("MiB", 16160, 1000)
    assert node_report(node("n", [16160], unit="bogus"), []).unit.value == "GiB"


def test_mixed_units_are_shown_in_mib() -> None:
    report = cluster_report([node("gib", [16384]), node("mib", [8192], unit="MiB")],
                            [pod("a", "gib", 2), pod("b", "mib", 512)])
    assert report.unit.value == "MiB"
    assert (report.total, report.allocated) == (16384 + 8192, 2048 + 512)
    rows = [line.split() for line in render.summary(report).splitlines()[1:3]]
    assert rows == [["gib", "10.0.0.1", "2048/16384", "2048/16384"], ["mib", "10.0.0.1", "512/8192", "512/8192"]]


def test_capacity_only_nodes_split_memory_evenly() -> None:
    bare = NodeInfo("old", capacity={"aliyun.com/gpu-mem": "30", "aliyun.com/gpu-count": "2"})
    report = node_report(bare, [pod("p", "old", 6, (1,))])
    assert [(g.index, g.total, g.allocated) for g in report.gpus] == [(0, 15, 0), (1, 15, 6)]


def test_empty_cluster_renders_zero_percent() -> None:
    report = cluster_report([NodeInfo("cpu")], [])
    assert report.nodes == ()
    assert render.summary(report).endswith("Allocated/Total GPU Memory In Cluster:\n0/0 (0%)\n")
    assert render.as_data(report) == {"unit": "GiB", "totalGPU": 0, "usedGPU": 0, "nodes": []}


def test_pending_column_only_when_something_is_pending() -> None:
    settled = cluster_report([node("n", [16384])], [pod("p", "n", 4)])
    assert "PENDING" not in render.summary(settled)
    waiting = cluster_report([node("n", [16384])], [pod("p", "n", 4, assigned=False)])
    assert "PENDING(Allocated)" in render.summary(waiting).splitlines()[0]


def test_nodes_and_pods_are_sorted() -> None:
    report = cluster_report([node("z", [16384]), node("a", [16384])],
                            [pod("p2", "a", 1), pod("p1", "a", 1), pod("p3", "z", 1)])
    assert [n.name for n in report.nodes] == ["a", "z"]
    assert [p.name for p in report.nodes[0].pods] == ["p1", "p2"]


def test_details_of_an_idle_node_say_so() -> None:
    text = render.details(cluster_report([node("idle", [16384])], []))
    expected = "NAME:       idle\nIPADDRESS:  10.0.0.1\n\nNo pods hold GPU memory on this node.\nAllocated :  0 (0%)"
    assert expected in text
