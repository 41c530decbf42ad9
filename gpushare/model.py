"""The cluster model: nodes, their GPUs, and which pods hold how much of each.

Pure data and arithmetic. The extender's cache, the CLI and the trace replay all build these objects and
hand them to the policies, so one set of rules decides what fits everywhere.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from operator import attrgetter
from types import MappingProxyType
from typing import Any

from gpushare.contract import (
    ANN_AFFINITY,
    ANN_ANTI_AFFINITY,
    ANN_EXCLUSION,
    ANN_MEMORY_UNIT,
    ANN_NODE_INVENTORY,
    NO_SHARING,
    RESOURCE_GPU_COUNT,
    RESOURCE_GPU_MEM,
    Assignment,
    GPUInventoryEntry,
    MemoryUnit,
    NodeInfo,
    PodInfo,
    PodRequest,
    RequestError,
    Sharing,
    UnitError,
    decode_inventory,
    host_requests,
    node_unit,
    pod_priority,
    read_assignment,
)
from gpushare.quantity import QuantityError, capacity_amount, to_int

# Labels that GPU feature discovery and Aliyun's node pools put on nodes, read when no inventory exists.
MODEL_LABELS = ("nvidia.com/gpu.product", "aliyun.accelerator/nvidia_name")

# HAMi's pair scores when the plugin published no topology: same NUMA node, or across CPUs.
SAME_NUMA_SCORE = 20
CROSS_NUMA_SCORE = 10


# Shared by every GPU without NVLink peers or sharing counts, read-only since these mappings are only ever
# replaced, never edited: four empty dicts of each GPU's own came to 2 kB a node, 30 MB at 15,000 nodes.
_NONE: Mapping[Any, int] = MappingProxyType({})


def _none() -> Mapping[Any, int]:
    return _NONE


@dataclass(slots=True)
class GPU:
    index: int
    model: str
    total: int
    used: int = 0
    compute_used: int = 0
    holders: int = 0
    exclusive: bool = False
    healthy: bool = True
    numa: int | None = None
    links: Mapping[int, int] = field(default_factory=_none)
    uuid: str = ""
    # How many of the pods on this GPU carry each sharing value (``contract.Sharing``); counts, so that a pod
    # leaving takes its value away only when it was the last to carry it. Each change assigns a new mapping and
    # never edits one in place, so a shallow copy of the GPU (``dataclasses.replace``) keeps counts of its own.
    affinity: Mapping[str, int] = field(default_factory=_none)
    anti_affinity: Mapping[str, int] = field(default_factory=_none)
    exclusion: Mapping[str, int] = field(default_factory=_none)

    @property
    def free(self) -> int:
        """Memory another pod could still get; an exclusively held or unhealthy GPU offers none."""
        if self.exclusive or not self.healthy:
            return 0
        return max(self.total - self.used, 0)

    def can_host(self, request: PodRequest) -> bool:
        if not self.healthy or self.exclusive or not request.models.accepts(self.model):
            return False
        # Plain pods on GPUs without exclusion values (nearly every call) skip the sharing rules: an identity test,
        # since parsing gives every pod without values the one NO_SHARING (any other empty Sharing is merely slower).
        if (self.exclusion or request.sharing is not NO_SHARING) and self.sharing_conflict(request) is not None:
            return False
        return self.has_room(request)

    def copy(self) -> GPU:
        """A copy that may be changed without touching this GPU; the sharing mappings are shared, since every change
        assigns a new one. Prioritize copies each changed node: one constructor call, five times faster than
        ``dataclasses.replace``."""
        return GPU(*_gpu_fields(self))

    def sharing_conflict(self, request: PodRequest) -> str | None:
        """Why the pod's sharing rules (``contract.Sharing``) keep it off this GPU, or ``None`` if they do not."""
        sharing = request.sharing
        if sharing.exclusion:
            if self.exclusion.get(sharing.exclusion, 0) != self.holders:
                return f"it holds pods without {ANN_EXCLUSION}={sharing.exclusion}"
        elif self.exclusion:
            return f"it holds pods of {ANN_EXCLUSION}={','.join(sorted(self.exclusion))} and the pod has none"
        if sharing.anti_affinity and sharing.anti_affinity in self.anti_affinity:
            return f"it holds a pod of {ANN_ANTI_AFFINITY}={sharing.anti_affinity}"
        if sharing.affinity:
            others = sorted(v for v in self.affinity if v != sharing.affinity)
            if others:
                return f"it holds the affinity group {ANN_AFFINITY}={','.join(others)}"
            if request.affinity_held and sharing.affinity not in self.affinity:
                return f"the pod's affinity group {ANN_AFFINITY}={sharing.affinity} is on other GPUs"
        return None

    def has_room(self, request: PodRequest) -> bool:
        """Memory and compute, ignoring who else is on the GPU."""
        if request.exclusive:
            # Whole and idle, and big enough: an exclusive pod still asks for its memory.
            return self.holders == 0 and self.used == 0 and self.total >= request.per_gpu
        return self.total - self.used >= request.per_gpu and self.compute_used + request.compute_percent <= 100

    def pair_score(self, other: GPU) -> int:
        """HAMi's topology score for running one pod across these two GPUs."""
        if other.index in self.links:
            return self.links[other.index]
        if self.numa is not None and self.numa == other.numa:
            return SAME_NUMA_SCORE
        return CROSS_NUMA_SCORE


@dataclass(frozen=True, slots=True)
class Placement:
    gpu_indices: tuple[int, ...]
    per_gpu: int
    compute_percent: int = 0
    exclusive: bool = False
    cpu_milli: int = 0
    memory_mib: int = 0
    priority: int = 0
    uid: str = ""
    """The pod's UID where it is known (preemption names its victims by UID); empty for a bind in flight."""
    sharing: Sharing = NO_SHARING


_gpu_fields = attrgetter(*(f.name for f in fields(GPU)))


@dataclass(slots=True)
class Node:
    name: str
    gpus: list[GPU]
    cpu_milli: int = 0
    memory_mib: int = 0
    cpu_used: int = 0
    memory_used: int = 0
    placements: dict[str, Placement] = field(default_factory=dict)
    unit: MemoryUnit = MemoryUnit.GiB
    """The unit of every memory figure of this node and of the pods placed on it (the node's plugin decides)."""
    defect: str | None = None
    """Why none of the node's GPUs can be used as published (for example an unknown memory unit), naming the node:
    for the log and ``kubectl inspect gpushare``."""
    defect_reason: str | None = None
    """The same without the node's name, for filter (see the reasons below); set with ``defect``."""

    def copy(self) -> Node:
        """A copy that planning (a gang's, a preemption's, a policy's view of the cluster) may fill without touching
        this node, such as the cache's."""
        return Node(self.name, [g.copy() for g in self.gpus], self.cpu_milli, self.memory_mib, self.cpu_used,
                    self.memory_used, dict(self.placements), self.unit, self.defect, self.defect_reason)

    def gpu(self, index: int) -> GPU | None:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        return None

    def fits_host_resources(self, request: PodRequest) -> bool:
        """CPU and memory, checked only where the node's capacity is known."""
        if self.cpu_milli and self.cpu_used + request.cpu_milli > self.cpu_milli:
            return False
        return not (self.memory_mib and self.memory_used + request.memory_mib > self.memory_mib)

    def hosts(self, request: PodRequest) -> list[GPU]:
        return [g for g in self.gpus if g.can_host(request)]

    def fits(self, request: PodRequest) -> bool:
        return self.fits_host_resources(request) and len(self.hosts(request)) >= request.gpu_count

    def place(self, pod_key: str, request: PodRequest, gpu_indices: Iterable[int]) -> Placement:
        """Account a pod on the given GPUs; raise ``ValueError`` if that would overcommit any of them."""
        placement = Placement(tuple(gpu_indices), request.per_gpu, request.compute_percent, request.exclusive,
                              request.cpu_milli, request.memory_mib, request.priority, sharing=request.sharing)
        self.add(pod_key, placement, strict=True)
        return placement

    def add(self, pod_key: str, placement: Placement, strict: bool = False) -> None:
        """Account a placement. With ``strict`` the GPUs must have room; rebuilding from annotations is lax
        because what the API already holds must be counted even if it overcommits."""
        if pod_key in self.placements:
            self.remove(pod_key)
        gpus = [self.gpu(i) for i in placement.gpu_indices]
        if strict:
            for index, gpu in zip(placement.gpu_indices, gpus, strict=True):
                if gpu is None:
                    raise ValueError(f"Node {self.name} has no GPU {index}.")
                if (placement.exclusive and gpu.holders) or gpu.exclusive or (
                        gpu.total - gpu.used < placement.per_gpu):
                    raise ValueError(f"GPU {index} on node {self.name} has no room for {pod_key}.")
        for gpu in gpus:
            if gpu is None:
                continue
            gpu.used += gpu.total if placement.exclusive else placement.per_gpu
            gpu.compute_used += placement.compute_percent
            gpu.holders += 1
            gpu.exclusive = gpu.exclusive or placement.exclusive
            if placement.sharing.constrained:
                _count_sharing(gpu, placement.sharing, 1)
        self.cpu_used += placement.cpu_milli
        self.memory_used += placement.memory_mib
        self.placements[pod_key] = placement

    def remove(self, pod_key: str) -> Placement | None:
        placement = self.placements.pop(pod_key, None)
        if placement is None:
            return None
        for index in placement.gpu_indices:
            gpu = self.gpu(index)
            if gpu is None:
                continue
            gpu.used -= gpu.total if placement.exclusive else placement.per_gpu
            gpu.compute_used -= placement.compute_percent
            gpu.holders -= 1
            if placement.exclusive:
                gpu.exclusive = False
            if placement.sharing.constrained:
                _count_sharing(gpu, placement.sharing, -1)
        self.cpu_used -= placement.cpu_milli
        self.memory_used -= placement.memory_mib
        return placement

    # The reasons below never name the node nor carry numbers that differ between nodes in the same situation:
    # kube-scheduler counts the nodes per distinct reason ("0/5000 nodes are available: 4200 node(s) have ..."), so
    # a reason per node made the pod's FailedScheduling Event and its PodScheduled condition list every node, tens
    # of kilobytes written again at each retry. ``kubectl inspect gpushare`` shows each GPU's free memory.

    def unresolvable_reason(self, request: PodRequest) -> str | None:
        """Why the pod could not run here even on an empty node, or ``None`` if it could."""
        if self.defect is not None:
            return self.defect_reason or self.defect
        models = [g for g in self.gpus if request.models.accepts(g.model)]
        if not self.gpus:
            return "node(s) have no GPUs that gpushare manages"
        if not models:
            have = ", ".join(sorted({g.model for g in self.gpus}))
            return f"node(s) have no GPU of model {request.models.describe()} (they have {have})"
        big = [g for g in models if g.total >= request.per_gpu]
        if len(big) < request.gpu_count:
            largest = max(g.total for g in models)
            unit = self.unit.value
            return (f"node(s) have {len(big)} GPU(s) of {request.per_gpu} {unit} or more, the pod needs "
                    f"{request.gpu_count} (their largest GPU has {largest} {unit})")
        if self.cpu_milli and request.cpu_milli > self.cpu_milli:
            return f"node(s) have only {self.cpu_milli}m CPU in all, the pod asks for {request.cpu_milli}m"
        if self.memory_mib and request.memory_mib > self.memory_mib:
            return f"node(s) have only {self.memory_mib}Mi memory in all, the pod asks for {request.memory_mib}Mi"
        return None

    def failure_reason(self, request: PodRequest) -> str:
        """Why the pod does not fit now; call only when ``fits`` is false."""
        if not self.fits_host_resources(request):
            return "node(s) lack free CPU or memory for the pod"
        refused = [f"GPU{g.index} because {why}" for g in self.gpus
                   if g.healthy and not g.exclusive and request.models.accepts(g.model) and g.has_room(request)
                   and (why := g.sharing_conflict(request)) is not None]
        hosts = len(self.hosts(request))
        if refused:
            # Which GPUs hold which groups differs between nodes; without it the refusal cannot be understood.
            return (f"node(s) have {hosts} GPU(s) the pod may share, it needs {request.gpu_count}; the pod's "
                    f"sharing rules refuse {'; '.join(refused)}")
        what = "entirely free GPU(s)" if request.exclusive else f"GPU(s) with {request.per_gpu} {self.unit.value} free"
        return f"node(s) have {hosts} {what}, the pod needs {request.gpu_count}"


def gpu_signature(g: GPU) -> Hashable:
    """Everything about a GPU that a placement decision may read (its half of ``state_signature``)."""
    return (g.index, g.model, g.total, g.used, g.compute_used, g.holders, g.exclusive, g.healthy, g.numa,
            tuple(sorted(g.links.items())), tuple(sorted(g.affinity.items())), tuple(sorted(g.anti_affinity.items())),
            tuple(sorted(g.exclusion.items())))


def state_signature(node: Node, gpus: Sequence[Hashable] | None = None) -> Hashable:
    """Everything about a node that a placement decision may read, except its name and its pod list.

    Policies are pure functions of this and the request, so nodes with equal signatures get equal answers:
    the trace replay and the extender's prioritize ask once per distinct state, not once per node. ``gpus``
    stands in for the GPUs' own signatures, one to one (equal GPUs, equal stand-ins), where those are known.
    """
    return (node.cpu_milli, node.memory_mib, node.cpu_used, node.memory_used,
            tuple(map(gpu_signature, node.gpus) if gpus is None else gpus))


def _count_sharing(gpu: GPU, sharing: Sharing, step: int) -> None:
    if sharing.affinity:
        gpu.affinity = _counted(gpu.affinity, sharing.affinity, step)
    if sharing.anti_affinity:
        gpu.anti_affinity = _counted(gpu.anti_affinity, sharing.anti_affinity, step)
    if sharing.exclusion:
        gpu.exclusion = _counted(gpu.exclusion, sharing.exclusion, step)


def _counted(counts: Mapping[str, int], value: str, step: int) -> dict[str, int]:
    """A new mapping with ``value`` counted ``step`` more times (dropped at 0)."""
    out = dict(counts)
    left = out.get(value, 0) + step
    if left > 0:
        out[value] = left
    else:
        out.pop(value, None)
    return out


def _gpus_from_capacity(node: NodeInfo, model: str) -> list[GPU]:
    """Aliyun's rule for nodes without an inventory: every GPU gets capacity / count."""
    try:
        mem = to_int(node.capacity.get(RESOURCE_GPU_MEM, "0"))
        count = to_int(node.capacity.get(RESOURCE_GPU_COUNT, "0"))
    except QuantityError:
        return []
    if count <= 0 or mem <= 0:
        return []
    return [GPU(index=i, model=model, total=mem // count) for i in range(count)]


def _unit_mismatch(node: NodeInfo, unit: MemoryUnit, entries: tuple[GPUInventoryEntry, ...]) -> UnitError | None:
    """The error to raise when the node's advertised device count says its plugin uses another unit than ``unit``.

    The kubelet's capacity counts the devices the plugin really advertises, one per unit of each GPU's memory;
    when it matches the inventory in the other unit and not in ``unit``, converting would be off by 1024x.
    """
    try:
        advertised = to_int(node.capacity.get(RESOURCE_GPU_MEM, "0"))
    except QuantityError:
        return None
    if not advertised:
        return None
    for other in MemoryUnit:
        if other is not unit and advertised == sum(other.from_mib(e.memory_mib) for e in entries) != sum(
                unit.from_mib(e.memory_mib) for e in entries):
            stated = ANN_MEMORY_UNIT in node.annotations
            said = f"says {node.annotations[ANN_MEMORY_UNIT]}" if stated else (
                f"does not say its unit, so the extender's default {unit.value} applies")
            # The annotation's value is a known unit here (``node_unit`` read it), so the reason stays one of a few.
            they_said = f"says {unit.value}" if stated else (
                f"does not say their unit, so the extender's default {unit.value} applies")
            return UnitError(
                f"Node {node.name} advertises {advertised} {RESOURCE_GPU_MEM} devices, which is its GPUs' memory in "
                f"{other.value}, but its {ANN_MEMORY_UNIT} annotation {said}; gpushare refuses to guess. Run the "
                "node's device plugin and the extender with the same unit, or upgrade the device plugin so that it "
                "publishes its unit.",
                f"node(s) advertise their GPUs' memory in {other.value} as {RESOURCE_GPU_MEM} devices, but their "
                f"{ANN_MEMORY_UNIT} annotation {they_said}; gpushare refuses to guess. Run their device plugin and the "
                "extender with the same unit (the extender's log and kubectl inspect gpushare name the nodes)")
    return None


def build_gpus(node: NodeInfo, unit: MemoryUnit) -> list[GPU]:
    """The node's GPUs in ``unit``, from the device plugin's inventory, else from its capacity.

    ``UnitError`` when the node's advertised devices show that its plugin counts in another unit.
    """
    text = node.annotations.get(ANN_NODE_INVENTORY)
    if text:
        try:
            entries = decode_inventory(text)
        except ValueError:
            entries = ()
        if entries:
            mismatch = _unit_mismatch(node, unit, entries)
            if mismatch is not None:
                raise mismatch
            return [GPU(index=e.index, model=e.model, total=unit.from_mib(e.memory_mib), healthy=e.healthy,
                        numa=e.numa, links=dict(e.links) if e.links else _NONE, uuid=e.uuid) for e in entries]
    model = next((node.labels[k] for k in MODEL_LABELS if k in node.labels), "unknown")
    return _gpus_from_capacity(node, model)


def build_node(node: NodeInfo, default_unit: MemoryUnit, pods: Iterable[PodInfo] = ()) -> Node:
    """A node's model in its own unit, with every active pod bound to it accounted from its annotations.

    ``default_unit`` is the unit of nodes whose device plugin does not publish one.
    """
    defect = defect_reason = None
    try:
        unit = node_unit(node, default_unit)
        gpus = build_gpus(node, unit)
    except UnitError as exc:
        unit, gpus, defect, defect_reason = default_unit, [], str(exc), exc.reason
    state = Node(name=node.name, gpus=gpus, cpu_milli=capacity_amount(node.allocatable, "cpu"),
                 memory_mib=capacity_amount(node.allocatable, "memory"), unit=unit, defect=defect,
                 defect_reason=defect_reason)
    for pod in pods:
        account_pod(state, pod)
    return state


def placement_of(pod: PodInfo, assignment: Assignment | None = None) -> Placement:
    """The placement a bound pod holds, including its CPU and memory."""
    try:
        cpu, memory = host_requests(pod)
    except RequestError:
        cpu = memory = 0
    priority = pod_priority(pod)
    if assignment is None:
        return Placement((), 0, cpu_milli=cpu, memory_mib=memory, priority=priority, uid=pod.uid)
    return Placement(assignment.gpu_indices, assignment.per_gpu, assignment.compute_percent,
                     assignment.exclusive, cpu, memory, priority, pod.uid, assignment.sharing)


def account_pod(node: Node, pod: PodInfo) -> None:
    """Count an active pod bound to ``node``; pods that finished or are terminating are left out."""
    if not pod.is_active or pod.node_name != node.name:
        return
    node.add(pod.key, placement_of(pod, read_assignment(pod)))


def gpu_capacity(nodes: Iterable[Node]) -> dict[str, int]:
    """GPU memory per model over ``nodes``, healthy GPUs only: what inventory-aware policies are fed
    (``gpushare.policies.base.InventoryAware``)."""
    capacity: dict[str, int] = {}
    for node in nodes:
        for gpu in node.gpus:
            if gpu.healthy:
                capacity[gpu.model] = capacity.get(gpu.model, 0) + gpu.total
    return capacity
