"""Per-GPU allocation of every gpushare node, built from node and pod views with the core's rules.

Pure: the same ``build_node`` that the extender uses decides what each pod holds, so the CLI and the scheduler
never disagree about usage.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpushare.contract import (
    ANN_NODE_INVENTORY,
    NODE_LABEL,
    RESOURCE_GPU_MEM,
    MemoryUnit,
    NodeInfo,
    PodInfo,
    decode_inventory,
    read_assignment,
    requests_gpu,
)
from gpushare.model import GPU, build_node
from gpushare.quantity import QuantityError, to_int


def is_gpushare_node(node: NodeInfo) -> bool:
    """Nodes labelled ``gpushare=true`` or advertising ``aliyun.com/gpu-mem``."""
    if node.labels.get(NODE_LABEL, "").lower() == "true":
        return True
    try:
        return to_int(node.capacity.get(RESOURCE_GPU_MEM, "0")) > 0
    except QuantityError:
        return False


@dataclass(frozen=True)
class PodUsage:
    namespace: str
    name: str
    by_gpu: Mapping[int, int]
    assigned: bool

    @property
    def total(self) -> int:
        return sum(self.by_gpu.values())


@dataclass(frozen=True)
class GPUReport:
    index: int
    model: str
    healthy: bool
    total: int
    allocated: int
    pending: int
    nvml_used_mib: int | None


@dataclass(frozen=True)
class NodeReport:
    name: str
    address: str
    unit: MemoryUnit
    gpus: tuple[GPUReport, ...]
    pods: tuple[PodUsage, ...]
    unplaced: tuple[str, ...]
    """Pods on the node that ask for GPU memory but carry no gpushare assignment (they skipped the extender)."""
    defect: str | None = None
    """Why the node's GPUs cannot be counted as published (the extender refuses the node for the same reason)."""

    @property
    def total(self) -> int:
        return sum(g.total for g in self.gpus)

    @property
    def allocated(self) -> int:
        return sum(g.allocated for g in self.gpus)

    @property
    def pending(self) -> int:
        return sum(p.total for p in self.pods if not p.assigned)


@dataclass(frozen=True)
class ClusterReport:
    nodes: tuple[NodeReport, ...]
    unit: MemoryUnit
    """The unit all figures are shown in: the nodes' common unit, or MiB when their units differ."""

    def scale(self, node: NodeReport) -> int:
        return node.unit.mib // self.unit.mib

    @property
    def total(self) -> int:
        return sum(n.total * self.scale(n) for n in self.nodes)

    @property
    def allocated(self) -> int:
        return sum(n.allocated * self.scale(n) for n in self.nodes)


def percent(part: int, whole: int) -> int:
    return part * 100 // whole if whole else 0


def _nvml_used(node: NodeInfo) -> dict[int, int]:
    try:
        entries = decode_inventory(node.annotations.get(ANN_NODE_INVENTORY, "[]"))
    except ValueError:
        return {}
    return {e.index: e.used_mib for e in entries if e.used_mib is not None}


def _pod_usage(pod: PodInfo, gpus: Mapping[int, GPU]) -> PodUsage | None:
    assignment = read_assignment(pod)
    if assignment is None:
        return None
    by_gpu: dict[int, int] = {}
    for index in assignment.gpu_indices:
        gpu = gpus.get(index)
        share = gpu.total if assignment.exclusive and gpu is not None else assignment.per_gpu
        by_gpu[index] = by_gpu.get(index, 0) + share
    return PodUsage(pod.namespace, pod.name, by_gpu, assignment.assigned)


def _wants_gpu(pod: PodInfo) -> bool:
    try:
        return requests_gpu(pod)
    except ValueError:
        return False


def node_report(node: NodeInfo, pods: Iterable[PodInfo]) -> NodeReport:
    active = sorted((p for p in pods if p.node_name == node.name and p.is_active), key=lambda p: p.key)
    # Nodes whose plugin does not say (Aliyun's) advertise GiB, Aliyun's default.
    state = build_node(node, MemoryUnit.GiB, active)
    gpus = {g.index: g for g in state.gpus}
    usages = [u for u in (_pod_usage(p, gpus) for p in active) if u is not None]
    unplaced = tuple(p.key for p in active if read_assignment(p) is None and _wants_gpu(p))
    nvml = _nvml_used(node)
    reports = tuple(
        GPUReport(index=g.index, model=g.model, healthy=g.healthy, total=g.total, allocated=g.used,
                  pending=sum(u.by_gpu.get(g.index, 0) for u in usages if not u.assigned),
                  nvml_used_mib=nvml.get(g.index))
        for g in sorted(state.gpus, key=lambda g: g.index))
    address = node.addresses[0] if node.addresses else ""
    return NodeReport(node.name, address, state.unit, reports, tuple(usages), unplaced, state.defect)


def cluster_report(nodes: Iterable[NodeInfo], pods: Iterable[PodInfo]) -> ClusterReport:
    pod_list = list(pods)
    reports = tuple(node_report(n, pod_list) for n in sorted(nodes, key=lambda n: n.name) if is_gpushare_node(n))
    units = {r.unit for r in reports}
    unit = units.pop() if len(units) == 1 else MemoryUnit.MiB
    return ClusterReport(reports, MemoryUnit.GiB if not reports else unit)
