"""The resource and annotation contract shared by the extender, the device plugin and the CLI.

Aliyun's names are kept verbatim so that existing pods, nodes and tooling work unchanged. Everything this
project adds lives under the ``gpushare.io/`` prefix. The contract is pure: it reads plain ``PodInfo`` and
``NodeInfo`` views that the adapters build from API objects, and writes plain annotation dictionaries.

Request semantics (documented in the README):

* ``aliyun.com/gpu-mem`` in container limits: GPU memory in the configured unit (GiB by default). The pod's
  total is the sum over its containers, as in Aliyun.
* ``gpushare.io/gpu-count: "<N>"`` (optional): the number of GPUs the pod spans on one node. The total memory
  is split evenly across them, so it must divide exactly. Absent means one GPU. ``aliyun.com/gpu-count`` in
  container limits is accepted too, but Kubernetes then also counts it against the node's ``gpu-count``
  capacity, which only suits pods that take their GPUs whole; the annotation has no such side effect.
* ``gpushare.io/exclusive: "true"``: every chosen GPU must be entirely free and is held whole.
* ``gpushare.io/gpu-compute: "<1..100>"``: the share of each chosen GPU's SMs the pod is guaranteed.
* ``gpushare.io/gpu-model`` / ``gpushare.io/gpu-model-exclude``: ``|`` or ``,`` separated model names,
  matched exactly and case-insensitively. HAMi's ``nvidia.com/use-gputype`` / ``nvidia.com/nouse-gputype``
  (case-insensitive substrings) and KubeShare's ``sharedgpu/gpu_model`` are accepted as aliases.
* ``gpushare.io/scheduler-policy`` (alias ``hami.io/gpu-scheduler-policy``) overrides the placement policy.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gpushare.quantity import QuantityError, to_int, to_mib, to_milli

RESOURCE_GPU_MEM = "aliyun.com/gpu-mem"
RESOURCE_GPU_COUNT = "aliyun.com/gpu-count"
MANAGED_RESOURCES = (RESOURCE_GPU_MEM, RESOURCE_GPU_COUNT)

NODE_LABEL = "gpushare"

ANN_IDX = "ALIYUN_COM_GPU_MEM_IDX"
ANN_POD = "ALIYUN_COM_GPU_MEM_POD"
ANN_DEV = "ALIYUN_COM_GPU_MEM_DEV"
ANN_ASSIGNED = "ALIYUN_COM_GPU_MEM_ASSIGNED"
ANN_ASSUME_TIME = "ALIYUN_COM_GPU_MEM_ASSUME_TIME"
ENV_CONTAINER = "ALIYUN_COM_GPU_MEM_CONTAINER"

PREFIX = "gpushare.io/"
ANN_GPU_INDICES = PREFIX + "gpu-indices"
ANN_PER_GPU = PREFIX + "gpu-mem-per-gpu"
ANN_CONTAINER_SHARES = PREFIX + "container-shares"
ANN_GPU_UUIDS = PREFIX + "gpu-uuids"
ANN_EXCLUSIVE = PREFIX + "exclusive"
ANN_COMPUTE = PREFIX + "gpu-compute"
ANN_GPU_COUNT = PREFIX + "gpu-count"
ANN_GPU_MODEL = PREFIX + "gpu-model"
ANN_GPU_MODEL_EXCLUDE = PREFIX + "gpu-model-exclude"
ANN_POLICY = PREFIX + "scheduler-policy"
ANN_NODE_INVENTORY = PREFIX + "gpu-inventory"
ANN_NODE_UNIT = PREFIX + "memory-unit"

HAMI_USE_GPUTYPE = "nvidia.com/use-gputype"
HAMI_NOUSE_GPUTYPE = "nvidia.com/nouse-gputype"
HAMI_GPU_POLICY = "hami.io/gpu-scheduler-policy"
KUBESHARE_GPU_MODEL = "sharedgpu/gpu_model"

POLICY_NAMES = ("binpack", "spread", "fgd", "fgd-lookahead")


class MemoryUnit(StrEnum):
    """The unit of one advertised ``aliyun.com/gpu-mem`` device."""

    GiB = "GiB"
    MiB = "MiB"

    @property
    def mib(self) -> int:
        return 1024 if self is MemoryUnit.GiB else 1

    def from_mib(self, mib: int) -> int:
        """Round to the nearest unit: a 16 GB card (16160 MiB) is 16 GiB, not 15."""
        return int((mib + self.mib // 2) // self.mib)


class RequestError(ValueError):
    """A pod's GPU request that can never be satisfied as written; the text is shown to the user."""


@dataclass(frozen=True)
class ContainerInfo:
    name: str
    limits: Mapping[str, str] = field(default_factory=dict)
    requests: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PodInfo:
    """The fields of a v1.Pod that gpushare reads, independent of any client library."""

    namespace: str
    name: str
    uid: str = ""
    node_name: str | None = None
    phase: str = "Pending"
    deleting: bool = False
    resource_version: str = ""
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    containers: tuple[ContainerInfo, ...] = ()
    init_containers: tuple[ContainerInfo, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def is_active(self) -> bool:
        """Whether the pod still holds its resources (Aliyun: not deleted, terminating or finished)."""
        return not self.deleting and self.phase not in ("Succeeded", "Failed")


@dataclass(frozen=True)
class NodeInfo:
    """The fields of a v1.Node that gpushare reads."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    capacity: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, str] = field(default_factory=dict)
    addresses: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelRule:
    """Which GPU models a pod accepts. ``substring`` follows HAMi's matching; otherwise names match exactly."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    substring: bool = False

    def accepts(self, model: str) -> bool:
        if not self.include and not self.exclude:
            return True  # the common case, asked once per GPU per node per pod: keep it cheap
        name = model.lower()
        if self.substring:
            included = any(p in name for p in self.include)
            excluded = any(p in name for p in self.exclude)
        else:
            included, excluded = name in self.include, name in self.exclude
        return (not self.include or included) and not excluded

    def describe(self) -> str:
        parts = []
        if self.include:
            parts.append("one of " + ", ".join(self.include))
        if self.exclude:
            parts.append("none of " + ", ".join(self.exclude))
        return " and ".join(parts) or "any model"


@dataclass(frozen=True)
class PodRequest:
    """A pod's GPU demand: ``gpu_count`` GPUs on one node, each giving ``per_gpu`` memory units."""

    per_gpu: int
    gpu_count: int = 1
    exclusive: bool = False
    compute_percent: int = 0
    models: ModelRule = ModelRule()
    policy: str | None = None
    container_shares: Mapping[str, int] = field(default_factory=dict)
    cpu_milli: int = 0
    memory_mib: int = 0

    @property
    def total(self) -> int:
        return self.per_gpu * self.gpu_count

    def shape(self) -> tuple[str, int, int, int]:
        """A hashable description used to learn the workload distribution."""
        return (self.models.describe(), self.gpu_count, self.per_gpu, self.cpu_milli)


def _limit(container: ContainerInfo, resource: str) -> int:
    value = container.limits.get(resource, container.requests.get(resource))
    if value is None:
        return 0
    try:
        return to_int(value)
    except QuantityError as exc:
        raise RequestError(f"Container {container.name!r} asks for {resource} {value!r}: {exc}") from None


def requests_gpu(pod: PodInfo) -> bool:
    """Whether the pod asks for any resource gpushare manages (the scheduler's managedResources test)."""
    return any(_limit(c, r) > 0 for c in pod.containers + pod.init_containers for r in MANAGED_RESOURCES)


def _split(value: str) -> tuple[str, ...]:
    return tuple(p.strip().lower() for p in value.replace("|", ",").split(",") if p.strip())


def model_rule(annotations: Mapping[str, str], labels: Mapping[str, str] | None = None) -> ModelRule:
    """Read the pod's model constraint from our annotations or a peer's alias."""
    labels = labels or {}
    if ANN_GPU_MODEL in annotations or ANN_GPU_MODEL_EXCLUDE in annotations:
        return ModelRule(_split(annotations.get(ANN_GPU_MODEL, "")),
                         _split(annotations.get(ANN_GPU_MODEL_EXCLUDE, "")))
    if HAMI_USE_GPUTYPE in annotations or HAMI_NOUSE_GPUTYPE in annotations:
        return ModelRule(_split(annotations.get(HAMI_USE_GPUTYPE, "")),
                         _split(annotations.get(HAMI_NOUSE_GPUTYPE, "")), substring=True)
    kubeshare = annotations.get(KUBESHARE_GPU_MODEL, labels.get(KUBESHARE_GPU_MODEL))
    if kubeshare:
        return ModelRule(_split(kubeshare))
    return ModelRule()


def host_requests(pod: PodInfo) -> tuple[int, int]:
    """Effective CPU and memory requests, the way kube-scheduler computes them (init containers as a max)."""

    def req(c: ContainerInfo, name: str) -> int:
        value = c.requests.get(name, c.limits.get(name))
        if value is None:
            return 0
        try:
            return to_milli(value) if name == "cpu" else to_mib(value)
        except QuantityError as exc:
            raise RequestError(f"Container {c.name!r} asks for {name} {value!r}: {exc}") from None

    cpu = sum(req(c, "cpu") for c in pod.containers)
    mem = sum(req(c, "memory") for c in pod.containers)
    for c in pod.init_containers:
        cpu = max(cpu, req(c, "cpu"))
        mem = max(mem, req(c, "memory"))
    return cpu, mem


def _gpu_count(pod: PodInfo) -> int:
    from_limits = sum(_limit(c, RESOURCE_GPU_COUNT) for c in pod.containers)
    text = pod.annotations.get(ANN_GPU_COUNT)
    if text is None:
        return from_limits or 1
    if not text.strip().isdigit() or not 1 <= int(text) <= 64:
        raise RequestError(f"Pod {pod.key} has {ANN_GPU_COUNT}={text!r}; use a whole number of GPUs from 1 to 64.")
    if from_limits and from_limits != int(text):
        raise RequestError(f"Pod {pod.key} asks for {text} GPUs in {ANN_GPU_COUNT} but {from_limits} in "
                           f"{RESOURCE_GPU_COUNT} limits; keep one of them.")
    return int(text)


def parse_request(pod: PodInfo) -> PodRequest:
    """Turn a pod spec into a ``PodRequest``; raise ``RequestError`` with a sentence for the user."""
    shares = {c.name: _limit(c, RESOURCE_GPU_MEM) for c in pod.containers}
    shares = {name: units for name, units in shares.items() if units > 0}
    total = sum(shares.values())
    count = _gpu_count(pod)
    if total <= 0:
        raise RequestError(f"Pod {pod.key} asks for no {RESOURCE_GPU_MEM}; set it in a container's limits.")
    if total % count:
        raise RequestError(
            f"Pod {pod.key} asks for {total} units of {RESOURCE_GPU_MEM} across {count} GPUs, which does not "
            f"divide evenly; ask for a multiple of {count}.")
    ann = pod.annotations
    exclusive = ann.get(ANN_EXCLUSIVE, "").lower() == "true"
    compute = ann.get(ANN_COMPUTE, "0").strip() or "0"
    if not compute.isdigit() or not 0 <= int(compute) <= 100:
        raise RequestError(f"Pod {pod.key} has {ANN_COMPUTE}={compute!r}; use a whole percentage from 1 to 100.")
    policy = ann.get(ANN_POLICY, ann.get(HAMI_GPU_POLICY))
    if policy is not None and policy not in POLICY_NAMES:
        raise RequestError(
            f"Pod {pod.key} asks for placement policy {policy!r}; use one of {', '.join(POLICY_NAMES)}.")
    cpu, memory = host_requests(pod)
    return PodRequest(per_gpu=total // count, gpu_count=count, exclusive=exclusive,
                      compute_percent=int(compute), models=model_rule(ann, pod.labels), policy=policy,
                      container_shares=shares, cpu_milli=cpu, memory_mib=memory)


@dataclass(frozen=True)
class Assignment:
    """What the extender recorded on a bound pod: which GPUs, and how much of each."""

    gpu_indices: tuple[int, ...]
    per_gpu: int
    exclusive: bool
    compute_percent: int
    assigned: bool
    assume_time_ns: int
    container_shares: Mapping[str, int]


def assignment_annotations(request: PodRequest, gpu_indices: Iterable[int], gpu_totals: Iterable[int],
                           assume_time_ns: int) -> dict[str, str]:
    """The annotations bind writes: Aliyun's five, plus ours for multi-GPU and per-container shares."""
    indices = tuple(gpu_indices)
    totals = tuple(gpu_totals)
    return {
        ANN_IDX: str(indices[0]),
        ANN_POD: str(request.total),
        ANN_DEV: str(totals[0]),
        ANN_ASSIGNED: "false",
        ANN_ASSUME_TIME: str(assume_time_ns),
        ANN_GPU_INDICES: ",".join(str(i) for i in indices),
        ANN_PER_GPU: str(request.per_gpu),
        ANN_CONTAINER_SHARES: json.dumps(dict(request.container_shares), sort_keys=True, separators=(",", ":")),
    }


def read_assignment(pod: PodInfo) -> Assignment | None:
    """The GPUs a bound pod holds, from its annotations; ``None`` if the extender never placed it.

    Pods placed by Aliyun's extender carry only the five Aliyun annotations; they read as one GPU.
    """
    ann = pod.annotations
    if ANN_IDX not in ann:
        return None
    try:
        indices = tuple(int(i) for i in ann.get(ANN_GPU_INDICES, ann[ANN_IDX]).split(","))
        total = int(ann.get(ANN_POD, "0"))
        per_gpu = int(ann.get(ANN_PER_GPU, total // max(len(indices), 1)))
        shares = json.loads(ann[ANN_CONTAINER_SHARES]) if ANN_CONTAINER_SHARES in ann else {}
        assume = int(ann.get(ANN_ASSUME_TIME, "0"))
        compute = int(ann.get(ANN_COMPUTE, "0") or 0)
    except (ValueError, json.JSONDecodeError):
        return None
    return Assignment(gpu_indices=indices, per_gpu=per_gpu,
                      exclusive=ann.get(ANN_EXCLUSIVE, "").lower() == "true", compute_percent=compute,
                      assigned=ann.get(ANN_ASSIGNED, "false").lower() == "true", assume_time_ns=assume,
                      container_shares={str(k): int(v) for k, v in shares.items()})


@dataclass(frozen=True)
class GPUInventoryEntry:
    """One GPU as the device plugin publishes it on its node (annotation ``gpushare.io/gpu-inventory``)."""

    index: int
    model: str
    memory_mib: int
    uuid: str = ""
    healthy: bool = True
    numa: int | None = None
    links: Mapping[int, int] = field(default_factory=dict)
    used_mib: int | None = None

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"index": self.index, "uuid": self.uuid, "model": self.model,
                                  "memoryMiB": self.memory_mib, "healthy": self.healthy}
        if self.numa is not None:
            out["numa"] = self.numa
        if self.links:
            out["links"] = {str(k): v for k, v in sorted(self.links.items())}
        if self.used_mib is not None:
            out["usedMiB"] = self.used_mib
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> GPUInventoryEntry:
        links = data.get("links") or {}
        numa = data.get("numa")
        used = data.get("usedMiB")
        assert isinstance(links, dict)
        return cls(index=int(str(data["index"])), model=str(data.get("model", "unknown")),
                   memory_mib=int(str(data["memoryMiB"])), uuid=str(data.get("uuid", "")),
                   healthy=bool(data.get("healthy", True)), numa=None if numa is None else int(str(numa)),
                   links={int(k): int(v) for k, v in links.items()},
                   used_mib=None if used is None else int(str(used)))


def encode_inventory(entries: Iterable[GPUInventoryEntry]) -> str:
    return json.dumps([e.to_json() for e in sorted(entries, key=lambda e: e.index)], separators=(",", ":"))


def decode_inventory(text: str) -> tuple[GPUInventoryEntry, ...]:
    """Parse the node inventory annotation; raise ``ValueError`` with a sentence on malformed data."""
    try:
        data = json.loads(text)
        if not isinstance(data, list):
            raise TypeError("not a list")
        return tuple(GPUInventoryEntry.from_json(d) for d in data)
    except (ValueError, TypeError, KeyError, AssertionError) as exc:
        raise ValueError(f"The {ANN_NODE_INVENTORY} annotation is not a JSON list of GPUs ({exc}); "
                         "restart the node's device plugin to rewrite it.") from None
