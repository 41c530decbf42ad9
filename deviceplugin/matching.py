"""Which pod a kubelet Allocate call is for, and which GPUs its container gets. Pure functions.

The kubelet calls Allocate once per container with device IDs only, never naming the pod. The pod is one of
those bound to this node that the extender placed (``ALIYUN_COM_GPU_MEM_ASSIGNED=false``) and that still
has a GPU container without devices:

* A container matches when its recorded share (``gpushare.io/container-shares``) equals the device count.
  Containers are taken in spec order, the order the kubelet admits them. Pods from Aliyun's extender (no
  shares recorded) match when their whole request equals the device count, as in Aliyun.
* Among matching pods, one whose extender-chosen GPUs are where the devices come from goes first (this
  plugin's ``GetPreferredAllocation`` steers the kubelet there); then the oldest ``ASSUME_TIME``.
* The devices decide the GPUs of a pod's first container when they form a valid placement (one GPU per
  requested GPU, evenly). Then the device IDs the kubelet records are the GPUs the container really uses,
  which is what lets the PodResources reconciler fix two same-size pods that the kubelet admitted in the
  other order. Exclusive pods and pods with a compute share keep the extender's GPUs, which it checked.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpushare.contract import (
    ANN_ASSIGNED,
    ANN_IDX,
    RESOURCE_GPU_MEM,
    Assignment,
    PodInfo,
    is_assigned,
    read_assignment,
    requests_gpu,
)


class NoPendingPod(LookupError):
    """No waiting pod matches an Allocate call; the text tells the operator why and what to do."""


@dataclass(frozen=True)
class Waiting:
    """A pod bound to this node with GPU containers still to be allocated."""

    pod: PodInfo
    assignment: Assignment
    containers: tuple[tuple[str, int], ...]
    """GPU containers in spec order with their shares; Aliyun pods have one entry named "" for the pod."""
    allocated: frozenset[str] = frozenset()

    def next_container(self, units: int) -> str | None:
        for name, share in self.containers:
            if name not in self.allocated and share == units:
                return name
        return None

    def is_last(self, container: str) -> bool:
        return {name for name, _ in self.containers} <= self.allocated | {container}


@dataclass(frozen=True)
class Match:
    waiting: Waiting
    container: str
    units: int
    gpus: tuple[int, ...]

    @property
    def moved(self) -> bool:
        """Whether the container gets other GPUs than the extender recorded."""
        return self.gpus != self.waiting.assignment.gpu_indices


def waiting_pods(pods: Iterable[PodInfo], allocated: Mapping[str, frozenset[str]] | None = None,
                 decided: Mapping[str, tuple[int, ...]] | None = None) -> list[Waiting]:
    """Pods placed by the extender whose GPU containers are not all allocated.

    The phase is not checked: a pod whose container was started on another pod's Allocate (a swap) is
    Running while it still waits.

    ``allocated`` and ``decided`` (by pod UID) are what this process already did, which the watch may not
    show yet: containers served, and the GPUs chosen for a pod's first container.
    """
    allocated = allocated or {}
    decided = decided or {}
    result = []
    for pod in pods:
        # Most pods on a node are long assigned: skip them before parsing their annotations.
        if is_assigned(pod) or not pod.is_active:
            continue
        assignment = read_assignment(pod)
        if assignment is None:
            continue
        if pod.uid in decided:
            assignment = replace(assignment, gpu_indices=decided[pod.uid])
        if assignment.container_shares:
            containers = tuple((c.name, assignment.container_shares[c.name]) for c in pod.containers
                               if c.name in assignment.container_shares)
        else:
            containers = (("", assignment.total),)
        done = frozenset(assignment.allocated_containers) | allocated.get(pod.uid, frozenset())
        waiting = Waiting(pod, assignment, containers, done)
        if any(name not in done for name, _ in containers):
            result.append(waiting)
    return result


def _age_order(waiting: Waiting) -> tuple[int, str]:
    return waiting.assignment.assume_time_ns, waiting.pod.key


def placement_from_devices(device_gpus: Counter[int], gpu_count: int) -> tuple[int, ...] | None:
    """The GPUs the devices describe, when they spread evenly over exactly ``gpu_count`` GPUs."""
    if len(device_gpus) != gpu_count or len(set(device_gpus.values())) != 1:
        return None
    return tuple(sorted(device_gpus))


def choose(waiting: Sequence[Waiting], units: int, device_gpus: Counter[int], node: str = "this node",
           unplaced: Sequence[PodInfo] = ()) -> Match:
    """The container an Allocate of ``units`` devices (from ``device_gpus``) is for."""
    eligible = [(w, c) for w in waiting if (c := w.next_container(units)) is not None]
    if not eligible:
        raise NoPendingPod(no_pending_message(node, units, waiting, unplaced))

    def rank(item: tuple[Waiting, str]) -> tuple[bool, int, str]:
        w = item[0]
        return (set(w.assignment.gpu_indices) != set(device_gpus), *_age_order(w))

    chosen, container = min(eligible, key=rank)
    assignment = chosen.assignment
    gpus = assignment.gpu_indices
    keeps_extender_choice = bool(chosen.allocated) or assignment.exclusive or assignment.compute_percent > 0
    if not keeps_extender_choice:
        from_devices = placement_from_devices(device_gpus, len(assignment.gpu_indices))
        if from_devices is not None and set(from_devices) != set(gpus):
            gpus = from_devices
    return Match(chosen, container, units, gpus)


def no_pending_message(node: str, units: int, waiting: Sequence[Waiting], unplaced: Sequence[PodInfo]) -> str:
    """Aliyun's plugin said "no-gpu-has-XMiB-to-run"; this says which pod went wrong and how to fix it."""
    text = (f"No pod bound to {node} is waiting for a container of {units} unit(s) of {RESOURCE_GPU_MEM}: "
            f"the pod being started was not placed by the gpushare scheduler extender (it lacks the {ANN_IDX} "
            f"annotation with {ANN_ASSIGNED}=false).")
    if unplaced:
        names = ", ".join(p.key for p in unplaced[:3])
        text += f" Pods here that ask for {RESOURCE_GPU_MEM} without the extender's annotations: {names}."
    if waiting:
        sizes = ", ".join(f"{w.pod.key} ({'/'.join(str(s) for _, s in w.containers)})" for w in waiting[:3])
        text += f" Pods waiting here ask for other sizes: {sizes}."
    return text + (" Fix: give the pod the schedulerName of the scheduler whose configuration lists the gpushare "
                   f"extender with managedResources {RESOURCE_GPU_MEM}, check that the extender is reachable, "
                   "then delete and recreate the pod.")


def unplaced_pods(pods: Iterable[PodInfo]) -> list[PodInfo]:
    """Active pods that ask for gpushare resources but never went through the extender."""
    result = []
    for pod in pods:
        if pod.is_active and pod.phase == "Pending" and ANN_IDX not in pod.annotations:
            try:
                if requests_gpu(pod):
                    result.append(pod)
            except ValueError:
                continue
    return result


def split_evenly(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def preferred_devices(waiting: Sequence[Waiting], units: int, available: Sequence[str],
                      must_include: Sequence[str], gpu_of: Mapping[str, int]) -> list[str]:
    """Devices to suggest for a container of ``units``: from the GPUs the extender chose for the oldest
    matching pod, so that Allocate's devices say which pod it is; else all from one GPU (the fullest that fits).
    """
    chosen = list(dict.fromkeys(must_include))
    pool = [d for d in available if d not in set(chosen) and d in gpu_of]
    by_gpu: dict[int, list[str]] = {}
    for device in pool:
        by_gpu.setdefault(gpu_of[device], []).append(device)
    eligible = sorted((w for w in waiting if w.next_container(units) is not None), key=_age_order)
    if eligible:
        targets = list(eligible[0].assignment.gpu_indices)
    else:
        fitting = sorted((len(ds), g) for g, ds in by_gpu.items() if len(ds) >= units)
        targets = [fitting[0][1]] if fitting else []
    missing = units - len(chosen)
    if targets and missing > 0:
        for gpu, quota in zip(targets, split_evenly(missing, len(targets)), strict=True):
            chosen.extend(by_gpu.get(gpu, [])[:quota])
    taken = set(chosen)
    chosen.extend(d for d in pool if d not in taken)
    return chosen[:max(units, len(must_include))]
