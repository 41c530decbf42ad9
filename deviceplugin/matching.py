"""Which pod a kubelet Allocate call is for, and which GPUs its container gets. Pure functions.

The kubelet calls Allocate once per container with device IDs only, never naming the pod. The pod is one of
those bound to this node that the extender placed (``ALIYUN_COM_GPU_MEM_ASSIGNED=false``) and that still
has a GPU container without devices:

* A container matches when its recorded share (``gpushare.io/container-shares``) equals the device count.
  Containers are taken in spec order, the order the kubelet admits them. Pods from Aliyun's extender (no
  shares recorded) match when their whole request equals the device count, as in Aliyun.
* Among matching pods, one whose extender-chosen GPUs are where the devices come from goes first (this
  plugin's ``GetPreferredAllocation`` steers the kubelet there); then the one that arrived bound first (the
  order of ``pods``, which the kubelet admits them in). Aliyun takes the oldest ``ASSUME_TIME`` instead, but
  binds run concurrently, and two pods' assume times may be in the other order than their bindings.
* The devices decide the GPUs of a pod's first container when they form a valid placement (one GPU per
  requested GPU, evenly). Then the device IDs the kubelet records are the GPUs the container really uses,
  which is what lets the PodResources reconciler fix two same-size pods that the kubelet admitted in the
  other order. Exclusive pods and pods with a compute share or sharing values (affinity, anti-affinity,
  exclusion) keep the extender's GPUs, which it checked.
* A call with several container requests is for several containers of one pod, matched together.
"""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpushare.contract import (
    ANN_ALLOCATED_CONTAINERS,
    ANN_ASSIGNED,
    ANN_CONTAINER_SHARES,
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
    arrival: int = 0
    """The pod's place in the order the pods arrived bound (``waiting_pods``' input order)."""

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
    for arrival, pod in enumerate(pods):
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
        waiting = Waiting(pod, assignment, containers, done, arrival)
        if any(name not in done for name, _ in containers):
            result.append(waiting)
    return result


def _arrival_order(waiting: Waiting) -> int:
    return waiting.arrival


def placement_from_devices(device_gpus: Counter[int], gpu_count: int) -> tuple[int, ...] | None:
    """The GPUs the devices describe, when they spread evenly over exactly ``gpu_count`` GPUs."""
    if len(device_gpus) != gpu_count or len(set(device_gpus.values())) != 1:
        return None
    return tuple(sorted(device_gpus))


def _containers_for(waiting: Waiting, sizes: Sequence[int]) -> list[str] | None:
    """The pod's unserved containers that take container requests of ``sizes``, in order; ``None`` if any
    request finds no container of its size left."""
    taken = set(waiting.allocated)
    names = []
    for units in sizes:
        name = next((n for n, share in waiting.containers if n not in taken and share == units), None)
        if name is None:
            return None
        taken.add(name)
        names.append(name)
    return names


def choose(waiting: Sequence[Waiting], requests: Sequence[tuple[int, Counter[int]]]) -> list[Match] | None:
    """The containers that one Allocate call's container requests (units, devices per GPU) are for, all of
    one pod; ``None`` when no waiting pod has a container for every request.

    The kubelet sends one container per call; a call with several is taken as several containers of one pod,
    so that it can be served, or refused, as a whole.
    """
    sizes = [units for units, _ in requests]
    eligible = [(w, names) for w in waiting if (names := _containers_for(w, sizes)) is not None]
    if not eligible:
        return None
    device_gpus = requests[0][1]

    def rank(item: tuple[Waiting, list[str]]) -> tuple[bool, int]:
        w = item[0]
        return set(w.assignment.gpu_indices) != set(device_gpus), _arrival_order(w)

    chosen, names = min(eligible, key=rank)
    assignment = chosen.assignment
    gpus = assignment.gpu_indices
    keeps_extender_choice = (bool(chosen.allocated) or assignment.exclusive or assignment.compute_percent > 0
                             or assignment.sharing.constrained)
    if not keeps_extender_choice:
        from_devices = placement_from_devices(device_gpus, len(assignment.gpu_indices))
        if from_devices is not None and set(from_devices) != set(gpus):
            gpus = from_devices
    matches = []
    served = chosen.allocated
    for name, units in zip(names, sizes, strict=True):
        matches.append(Match(replace(chosen, allocated=served), name, units, gpus))
        served = served | {name}
    return matches


@dataclass(frozen=True)
class Served:
    """A container that already got its devices and has the size an unmatched Allocate asked for."""

    pod: PodInfo
    container: str
    """Empty for a pod placed by Aliyun's extender, which records no containers."""
    units: int
    gpus: tuple[int, ...]


def served_containers(pods: Iterable[PodInfo], sizes: Collection[int]) -> list[Served]:
    """Containers of active pods on the node whose allocation is recorded and whose share is one of ``sizes``."""
    found: list[Served] = []
    for pod in pods:
        if not pod.is_active:
            continue
        assignment = read_assignment(pod)
        if assignment is None:
            continue
        shares = dict(assignment.container_shares) or {"": assignment.total}
        done = set(shares) if assignment.assigned else set(assignment.allocated_containers)
        found.extend(Served(pod, name, units, assignment.gpu_indices) for name, units in shares.items()
                     if name in done and units in sizes)
    return found


def no_pending_message(node: str, sizes: Sequence[int], waiting: Sequence[Waiting], unplaced: Sequence[PodInfo],
                       served: Sequence[Served], served_at: Mapping[str, float]) -> str:
    """Why no pod matches an Allocate call, and what to do; Aliyun's plugin said "no-gpu-has-XMiB-to-run".

    The likeliest cause leads: a pod that bypassed the extender (it is Pending here, so the kubelet is probably
    starting it), else a container of that size that already got its devices, else placed pods of other sizes.
    ``served_at`` (by pod UID) is when this process recorded a pod's allocation.
    """
    asked = " and ".join(str(s) for s in sizes)
    text = (f"No pod bound to {node} is waiting for {'a container' if len(sizes) == 1 else 'containers'} of "
            f"{asked} unit(s) of {RESOURCE_GPU_MEM}")
    others = ""
    if waiting:
        pods = ", ".join(f"{w.pod.key} ({_unserved(w)})" for w in waiting[:3])
        more = f" and {len(waiting) - 3} more" if len(waiting) > 3 else ""
        others = f" Pods the extender placed here wait for other sizes: {pods}{more}."
    if unplaced:
        names = ", ".join(p.key for p in unplaced[:3])
        return (text + f": the pod being started was not placed by the gpushare scheduler extender (it lacks the "
                f"{ANN_IDX} annotation with {ANN_ASSIGNED}=false). Pods here that ask for {RESOURCE_GPU_MEM} without "
                f"the extender's annotations: {names}.{others} Fix: give the pod the schedulerName of the scheduler "
                f"whose configuration lists the gpushare extender with managedResources {RESOURCE_GPU_MEM}, check "
                "that the extender is reachable, then delete and recreate the pod.")
    if served:
        first = served[0]
        who = f"container {first.container} of pod {first.pod.key}" if first.container else f"pod {first.pod.key}"
        at = served_at.get(first.pod.uid)
        when = (f"this device plugin recorded it at {_utc(at)}" if at is not None else
                f"its annotations record it ({ANN_ALLOCATED_CONTAINERS} or {ANN_ASSIGNED}=true), written before "
                "this device plugin process started")
        also = f" ({len(served) - 1} other container(s) of that size already got theirs too)" if len(served) > 1 else ""
        return (text + f": {who} already got its {first.units} unit(s) on GPU(s) {_names(first.gpus)}; {when}"
                f"{also}.{others} The kubelet calls Allocate once per container and keeps the answer across "
                "container restarts, so a second call means it lost its record of the devices it gave (it "
                "restarted without its device checkpoint) or something other than the kubelet called the plugin. "
                "gpushare never allocates a container twice: if that pod must start again, delete it so that its "
                "controller recreates it.")
    if waiting:
        return (text + f".{others} The kubelet asks for exactly a container's {RESOURCE_GPU_MEM} limit, so the pod "
                "being started is none of them, or its limits disagree with the shares the extender recorded "
                f"({ANN_CONTAINER_SHARES}). Delete and recreate the pod so that the extender places it again.")
    return (text + ", and no pod here asks for that size: if the kubelet is starting a pod, it was deleted or "
            "has not reached this plugin's watch; otherwise something other than the kubelet called the plugin.")


def _unserved(waiting: Waiting) -> str:
    return ", ".join(f"{name or 'whole pod'}: {share}" for name, share in waiting.containers
                     if name not in waiting.allocated)


def _names(gpus: Iterable[int]) -> str:
    return ",".join(str(i) for i in gpus)


def _utc(epoch_s: float) -> str:
    return datetime.datetime.fromtimestamp(epoch_s, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    eligible = sorted((w for w in waiting if w.next_container(units) is not None), key=_arrival_order)
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
