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
* ``gpushare.io/gpu-compute: "<0..100>"``: the share of each chosen GPU's SMs the pod is guaranteed (0: none).
  ``gpushare.io/gpu-compute-limit: "<1..100>"``: the ceiling the container may burst to when the GPU is idle, at
  least the guaranteed share (absent: the guaranteed share, or no ceiling without one). KubeShare's
  ``sharedgpu/gpu_request`` / ``sharedgpu/gpu_limit`` (fractions of GPU time up to 1.0, labels or annotations)
  are accepted as aliases and converted to whole percentages.
* ``gpushare.io/gpu-affinity``, ``gpushare.io/gpu-anti-affinity``, ``gpushare.io/gpu-exclusion``: who a pod may
  share its GPUs with (``Sharing``; KubeShare 1.0's ``kubeshare/sched_*`` annotations or labels are aliases).
* ``gpushare.io/gpu-model`` / ``gpushare.io/gpu-model-exclude``: ``|`` or ``,`` separated model names,
  matched exactly and case-insensitively. HAMi's ``nvidia.com/use-gputype`` / ``nvidia.com/nouse-gputype``
  (case-insensitive substrings) and KubeShare's ``sharedgpu/gpu_model`` are accepted as aliases.
* ``gpushare.io/scheduler-policy`` (alias ``hami.io/gpu-scheduler-policy``) overrides the placement policy.
* A pod's priority is ``spec.priority`` (set from its PriorityClass); KubeShare's ``sharedgpu/priority`` label is
  read where the pod has none. A ``sharedgpu/priority`` of 0 marks the pod opportunistic: like a pod with
  ``spec.preemptionPolicy: Never`` it never preempts another.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from enum import StrEnum

from gpushare.logs import clip
from gpushare.quantity import QuantityError, host_amount, to_int

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
ANN_CONTAINER_SHARES = PREFIX + "container-shares"
ANN_ALLOCATED_CONTAINERS = PREFIX + "allocated-containers"
ANN_GPU_UUIDS = PREFIX + "gpu-uuids"
ANN_EXCLUSIVE = PREFIX + "exclusive"
ANN_COMPUTE = PREFIX + "gpu-compute"
ANN_GPU_COUNT = PREFIX + "gpu-count"
ANN_GPU_MODEL = PREFIX + "gpu-model"
ANN_GPU_MODEL_EXCLUDE = PREFIX + "gpu-model-exclude"
ANN_POLICY = PREFIX + "scheduler-policy"
ANN_NODE_INVENTORY = PREFIX + "gpu-inventory"
ANN_COMPUTE_LIMIT = PREFIX + "gpu-compute-limit"
ANN_AFFINITY = PREFIX + "gpu-affinity"
ANN_ANTI_AFFINITY = PREFIX + "gpu-anti-affinity"
ANN_EXCLUSION = PREFIX + "gpu-exclusion"
ANN_MEMORY_UNIT = PREFIX + "memory-unit"
"""On a node: the unit its device plugin advertises in. On a pod: the unit its assignment is written in."""

HAMI_USE_GPUTYPE = "nvidia.com/use-gputype"
HAMI_NOUSE_GPUTYPE = "nvidia.com/nouse-gputype"
HAMI_GPU_POLICY = "hami.io/gpu-scheduler-policy"
KUBESHARE_GPU_MODEL = "sharedgpu/gpu_model"
KUBESHARE_PRIORITY = "sharedgpu/priority"
KUBESHARE_GPU_REQUEST = "sharedgpu/gpu_request"
KUBESHARE_GPU_LIMIT = "sharedgpu/gpu_limit"
KUBESHARE_AFFINITY = "kubeshare/sched_affinity"
KUBESHARE_ANTI_AFFINITY = "kubeshare/sched_anti-affinity"
KUBESHARE_EXCLUSION = "kubeshare/sched_exclusion"

# Kubernetes' priorities are 32-bit integers (PriorityClass.value).
MIN_PRIORITY = -(2**31)
MAX_PRIORITY = 2**31 - 1

POLICY_NAMES = ("binpack", "spread", "fgd", "fgd-lookahead", "fgd-scarcity")

# The most GPUs one pod may span on one node (annotation or container limits).
MAX_GPU_COUNT = 64


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


class UnitError(ValueError):
    """A node names a memory unit gpushare does not know; the text tells the operator what to fix.

    ``reason`` says the same without the node's name or its own values, for filter: kube-scheduler counts the
    nodes per distinct reason, so a fleet with the same fault reads as one line of the pod's Event.
    """

    def __init__(self, sentence: str, reason: str) -> None:
        super().__init__(sentence)
        self.reason = reason


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
    priority: int | None = None
    """``spec.priority``; ``None`` where no admission plugin set one."""
    preemption_policy: str = ""
    """``spec.preemptionPolicy``: ``Never`` means the pod waits instead of preempting."""
    nominated_node: str | None = None
    """``status.nominatedNodeName``: where a preemption freed room for this pod, before it is bound."""

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


@dataclass(frozen=True, slots=True)
class Sharing:
    """Who a pod may share its GPUs with: KubeShare 1.0's scheduling labels, one value each ("" for none).

    * ``affinity``: pods with the same value share a GPU. Once some GPU in the cluster holds one of them, the
      others may only go to the GPU(s) holding it (``PodRequest.affinity_held``). A GPU holds pods of at most one
      affinity value; pods without one may still join it.
    * ``anti_affinity``: never on a GPU that holds a pod with the same value.
    * ``exclusion``: a GPU holds pods of one exclusion value only, and having none counts as a value of its own
      (KubeShare's rule): a pod with exclusion X takes an idle GPU or one holding only X pods, and a pod without
      one never joins a GPU holding an X pod.

    Every GPU of a multi-GPU pod obeys them. Exclusive pods hold idle GPUs alone, so anti-affinity and exclusion
    hold trivially, and affinity is refused for them (``parse_request``).
    """

    affinity: str = ""
    anti_affinity: str = ""
    exclusion: str = ""

    @property
    def constrained(self) -> bool:
        return bool(self.affinity or self.anti_affinity or self.exclusion)


NO_SHARING = Sharing()


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
    priority: int = 0
    preempts: bool = True
    """Whether the pod may have lower-priority pods evicted to make room (not opportunistic, not ``Never``)."""
    compute_limit: int = 0
    """The ceiling of each GPU's SMs the container may burst to, in percent (0: none); never below
    ``compute_percent``. The isolation layer enforces it; the scheduler accounts only ``compute_percent``."""
    sharing: Sharing = NO_SHARING
    affinity_held: bool = False
    """Set by the extender's cache, never parsed: some GPU in the cluster already holds a pod of the same
    ``sharing.affinity``, so only GPUs holding one can host this pod."""

    @property
    def total(self) -> int:
        return self.per_gpu * self.gpu_count

    def shape(self) -> tuple[str, int, int, int]:
        """A hashable description used to learn the workload distribution."""
        return (self.models.describe(), self.gpu_count, self.per_gpu, self.cpu_milli)


def _quantity_error(container: ContainerInfo, resource: str, value: str, exc: QuantityError) -> RequestError:
    # The parser's sentence starts with the whole value; the clipped one is already in ours.
    reason = str(exc).replace(repr(value), "it", 1)
    return RequestError(f"Container {clip(container.name)} asks for {resource} {clip(value)}: {reason}")


def _units(container: ContainerInfo, resource: str) -> int:
    value = container.limits.get(resource, container.requests.get(resource))
    if value is None:
        return 0
    try:
        units = to_int(value)
    except QuantityError as exc:
        raise _quantity_error(container, resource, value, exc) from None
    # The API server refuses negative extended resources; a pod sent straight to the extender is held to the same.
    if units < 0:
        raise RequestError(f"Container {clip(container.name)} asks for {resource} {clip(value)}; use a whole number "
                           "of 0 or more.")
    if resource == RESOURCE_GPU_COUNT and units > MAX_GPU_COUNT:
        raise RequestError(f"Container {clip(container.name)} asks for {resource} {clip(value)}; use a whole number "
                           f"of GPUs from 1 to {MAX_GPU_COUNT}.")
    return units


def requests_gpu(pod: PodInfo) -> bool:
    """Whether the pod asks for any resource gpushare manages (the scheduler's managedResources test)."""
    return any(_units(c, r) > 0 for c in pod.containers + pod.init_containers for r in MANAGED_RESOURCES)


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


# What kube-scheduler's scoring counts for a container that sets no CPU or no memory request (its
# DefaultMilliCPURequest and DefaultMemoryRequest): otherwise every node would look as free to pods that ask for
# nothing, and they would pile onto one.
UNSET_CPU_SCORED_MILLI = 100
UNSET_MEMORY_SCORED_MIB = 200


def _host_amount(container: ContainerInfo, name: str, unset: int = 0) -> int:
    value = container.requests.get(name, container.limits.get(name))
    if value is None:
        return unset
    try:
        amount = host_amount(name, value)
    except QuantityError as exc:
        raise _quantity_error(container, name, value, exc) from None
    if amount < 0:
        raise RequestError(f"Container {clip(container.name)} asks for {name} {clip(value)}; use an amount of 0 or "
                           "more.")
    return amount


def host_requests(pod: PodInfo, scored: bool = False) -> tuple[int, int]:
    """Effective CPU and memory requests, the way kube-scheduler computes them (init containers as a max).

    With ``scored``, as its scoring plugins count them: a container that sets no request counts the defaults above.
    """
    unset_cpu, unset_mem = (UNSET_CPU_SCORED_MILLI, UNSET_MEMORY_SCORED_MIB) if scored else (0, 0)
    cpu = sum(_host_amount(c, "cpu", unset_cpu) for c in pod.containers)
    mem = sum(_host_amount(c, "memory", unset_mem) for c in pod.containers)
    for c in pod.init_containers:
        cpu = max(cpu, _host_amount(c, "cpu", unset_cpu))
        mem = max(mem, _host_amount(c, "memory", unset_mem))
    return cpu, mem


def _exclusive(annotations: Mapping[str, str]) -> bool:
    return annotations.get(ANN_EXCLUSIVE, "").strip().lower() == "true"


def _given(pod: PodInfo, ours: str, alias: str) -> tuple[str, str] | None:
    """``(name, value)`` of the first that the pod sets: our annotation, the peer's annotation, the peer's label.

    KubeShare 1.0 read its names from annotations and KubeShare 2.0 from labels, so both are accepted.
    """
    if ours in pod.annotations:
        return ours, pod.annotations[ours]
    if alias in pod.annotations:
        return alias, pod.annotations[alias]
    if alias in pod.labels:
        return alias, pod.labels[alias]
    return None


def _whole_percent(text: str) -> int | None:
    stripped = text.strip() or "0"
    # At most 3 digits before int(): a 5,000-digit value is refused without converting it.
    if not stripped.isdigit() or len(stripped) > 3 or int(stripped) > 100:
        return None
    return int(stripped)


_FRACTION = re.compile(r"[01]?(\.[0-9]{0,8})?")


def _fraction_percent(text: str) -> int | None:
    """A KubeShare fraction of GPU time (0 to 1.0) as a whole percentage, rounded half up."""
    stripped = text.strip()
    if stripped in ("", ".") or not _FRACTION.fullmatch(stripped) or Decimal(stripped) > 1:
        return None
    return int((Decimal(stripped) * 100).to_integral_value(ROUND_HALF_UP))


def compute_share(pod: PodInfo) -> tuple[int, int]:
    """The pod's guaranteed compute share and the ceiling it may burst to, in whole percent of each GPU's SMs.

    The ceiling defaults to the guaranteed share (0 when neither is set: no ceiling). ``RequestError`` names the
    field and what it allows.
    """
    request = 0
    given = _given(pod, ANN_COMPUTE, KUBESHARE_GPU_REQUEST)
    if given is not None:
        name, text = given
        parsed = _whole_percent(text) if name == ANN_COMPUTE else _fraction_percent(text)
        if parsed is None:
            allowed = ("a whole percentage from 0 to 100 (0, or no annotation, asks for no guaranteed share)"
                       if name == ANN_COMPUTE else "a fraction of GPU time from 0 to 1.0, such as 0.5")
            raise RequestError(f"Pod {pod.key} has {name}={clip(text)}; use {allowed}.")
        request = parsed
    given = _given(pod, ANN_COMPUTE_LIMIT, KUBESHARE_GPU_LIMIT)
    if given is None:
        return request, request
    name, text = given
    lowest = max(request, 1)
    limit = _whole_percent(text) if name == ANN_COMPUTE_LIMIT else _fraction_percent(text)
    if limit is None or limit < lowest:
        allowed = (f"a whole percentage from {lowest} to 100" if name == ANN_COMPUTE_LIMIT
                   else f"a fraction of GPU time from {lowest / 100:g} to 1.0")
        raise RequestError(f"Pod {pod.key} has {name}={clip(text)}; use {allowed}: a ceiling above 0 and at least "
                           f"the pod's guaranteed compute share ({request}%).")
    return request, limit


# A sharing value must be a valid Kubernetes label value, so that it reads the same as a label or an annotation.
_SHARING_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")

_SHARING_NAMES = ((ANN_AFFINITY, KUBESHARE_AFFINITY), (ANN_ANTI_AFFINITY, KUBESHARE_ANTI_AFFINITY),
                  (ANN_EXCLUSION, KUBESHARE_EXCLUSION))


def _sharing_value(pod: PodInfo, ours: str, alias: str) -> str:
    given = _given(pod, ours, alias)
    if given is None:
        return ""
    name, text = given
    value = text.strip()
    if value and not _SHARING_VALUE.fullmatch(value):
        raise RequestError(f"Pod {pod.key} has {name}={clip(text)}; use 1 to 63 letters, digits, '-', '_' or '.', "
                           "starting and ending with a letter or digit (a Kubernetes label value).")
    return value


def sharing_rules(pod: PodInfo) -> Sharing:
    """The pod's affinity, anti-affinity and exclusion values (an empty value is none); ``RequestError`` names a
    malformed one."""
    affinity, anti_affinity, exclusion = (_sharing_value(pod, ours, alias) for ours, alias in _SHARING_NAMES)
    if not (affinity or anti_affinity or exclusion):
        return NO_SHARING  # the one instance GPU.can_host tells apart by identity
    return Sharing(affinity, anti_affinity, exclusion)


def _gpu_count(pod: PodInfo, from_limits: int) -> int:
    text = pod.annotations.get(ANN_GPU_COUNT)
    if text is None:
        if from_limits > MAX_GPU_COUNT:
            raise RequestError(f"Pod {pod.key} asks for {from_limits} GPUs in {RESOURCE_GPU_COUNT} limits over its "
                               f"containers; use a whole number of GPUs from 1 to {MAX_GPU_COUNT}.")
        return from_limits or 1
    # At most 3 digits before int(): a 5,000-digit count is refused without converting it.
    if not text.strip().isdigit() or len(text.strip()) > 3 or not 1 <= int(text) <= MAX_GPU_COUNT:
        raise RequestError(f"Pod {pod.key} has {ANN_GPU_COUNT}={clip(text)}; use a whole number of GPUs from 1 to "
                           f"{MAX_GPU_COUNT}.")
    if from_limits and from_limits != int(text):
        raise RequestError(f"Pod {pod.key} asks for {text} GPUs in {ANN_GPU_COUNT} but {from_limits} in "
                           f"{RESOURCE_GPU_COUNT} limits; keep one of them.")
    return int(text)


def _alias_priority(pod: PodInfo) -> int | None:
    """KubeShare's ``sharedgpu/priority`` label; ``None`` when absent, ``RequestError`` when not a priority."""
    text = pod.labels.get(KUBESHARE_PRIORITY)
    if text is None:
        return None
    stripped = text.strip()
    digits = stripped[1:] if stripped[:1] == "-" else stripped
    # At most 10 digits before int(): a 5,000-digit label is refused without converting it.
    if not digits.isdigit() or len(digits) > 10 or not MIN_PRIORITY <= int(stripped) <= MAX_PRIORITY:
        raise RequestError(f"Pod {pod.key} has label {KUBESHARE_PRIORITY}={clip(text)}; use a whole number from "
                           f"{MIN_PRIORITY} to {MAX_PRIORITY} (0 marks the pod opportunistic).")
    return int(stripped)


def pod_priority(pod: PodInfo) -> int:
    """The pod's priority: ``spec.priority``, else KubeShare's label, else 0 (Kubernetes' default).

    An admission plugin sets ``spec.priority`` on every pod of a real cluster, so the label decides only where
    nothing did; a malformed label counts as absent here (``parse_request`` tells the pod's owner).
    """
    if pod.priority is not None:
        return pod.priority
    try:
        alias = _alias_priority(pod)
    except RequestError:
        alias = None
    return 0 if alias is None else alias


def may_preempt(pod: PodInfo) -> bool:
    """Whether the pod may evict lower-priority pods: not ``preemptionPolicy: Never`` and not opportunistic."""
    if pod.preemption_policy == "Never":
        return False
    try:
        return _alias_priority(pod) != 0
    except RequestError:
        return True


def parse_request(pod: PodInfo) -> PodRequest:
    """What the policies place for this pod; raise ``RequestError`` with a sentence for the user.

    A pod asking for a gpushare resource gets its GPU request. A pod asking for none gets ``gpu_count`` 0 and
    only its CPU and memory: kube-scheduler sends such pods when the extender's configuration lists no
    ``managedResources``, and the policies place those too (``fgd-lookahead`` steers them to CPU-rich nodes).
    """
    shares: dict[str, int] = {}
    count_in_limits = 0
    asks_gpu = False
    for c in pod.containers:
        units, count = _units(c, RESOURCE_GPU_MEM), _units(c, RESOURCE_GPU_COUNT)
        if units > 0:
            shares[c.name] = units
        count_in_limits += count
        asks_gpu = asks_gpu or units > 0 or count > 0
    asks_gpu = asks_gpu or any(_units(c, r) > 0 for c in pod.init_containers for r in MANAGED_RESOURCES)
    cpu, memory = host_requests(pod)
    _alias_priority(pod)  # a malformed label is the pod's error, before anything places it
    priority, preempts = pod_priority(pod), may_preempt(pod)
    if not asks_gpu:
        return PodRequest(per_gpu=0, gpu_count=0, cpu_milli=cpu, memory_mib=memory, priority=priority,
                          preempts=preempts)
    total = sum(shares.values())
    count = _gpu_count(pod, count_in_limits)
    if total <= 0:
        raise RequestError(f"Pod {pod.key} asks for no {RESOURCE_GPU_MEM}; set it in a container's limits.")
    if total % count:
        raise RequestError(
            f"Pod {pod.key} asks for {total} units of {RESOURCE_GPU_MEM} across {count} GPUs, which does not "
            f"divide evenly; ask for a multiple of {count}.")
    ann = pod.annotations
    compute, compute_limit = compute_share(pod)
    sharing = sharing_rules(pod)
    if sharing.affinity and _exclusive(ann):
        raise RequestError(f"Pod {pod.key} has {ANN_EXCLUSIVE}=true and the GPU affinity value "
                           f"{clip(sharing.affinity)}; an exclusive pod shares its GPUs with no one, so drop one of "
                           "them.")
    policy = ann.get(ANN_POLICY, ann.get(HAMI_GPU_POLICY))
    if policy is not None and policy not in POLICY_NAMES:
        raise RequestError(
            f"Pod {pod.key} asks for placement policy {clip(policy)}; use one of {', '.join(POLICY_NAMES)}.")
    return PodRequest(per_gpu=total // count, gpu_count=count, exclusive=_exclusive(ann),
                      compute_percent=compute, models=model_rule(ann, pod.labels), policy=policy,
                      container_shares=shares, cpu_milli=cpu, memory_mib=memory, priority=priority,
                      preempts=preempts, compute_limit=compute_limit, sharing=sharing)


def node_unit(node: NodeInfo, default: MemoryUnit) -> MemoryUnit:
    """The unit of one ``aliyun.com/gpu-mem`` device on this node, as its device plugin publishes it.

    ``default`` covers nodes whose plugin does not say (Aliyun's plugin, or one from before the annotation).
    """
    text = node.annotations.get(ANN_MEMORY_UNIT)
    if text is None:
        return default
    try:
        return MemoryUnit(text.strip())
    except ValueError:
        raise UnitError(
            f"Node {node.name} says its {RESOURCE_GPU_MEM} devices are {text[:40]!r} ({ANN_MEMORY_UNIT}); gpushare "
            f"knows {' and '.join(u.value for u in MemoryUnit)}. Check the version and --unit flag of the node's "
            "gpushare device plugin.",
            f"node(s) say their {RESOURCE_GPU_MEM} devices are in a unit gpushare does not know ({ANN_MEMORY_UNIT}); "
            f"gpushare knows {' and '.join(u.value for u in MemoryUnit)}. Check the version and --unit flag of their "
            "gpushare device plugin (the extender's log and kubectl inspect gpushare name them)") from None


def unit_annotation(unit: MemoryUnit) -> dict[str, str]:
    """What the device plugin publishes on its node so that every component reads the node's unit."""
    return {ANN_MEMORY_UNIT: unit.value}


@dataclass(frozen=True)
class Assignment:
    """Which GPUs a pod holds and how much of each: the one codec of the assignment annotations.

    The extender writes it at bind (``assigned`` false); the device plugin completes it at Allocate (the GPUs
    the kubelet really gave, the containers served, ``assigned`` true). Everyone reads it with
    ``read_assignment``. Pods placed by Aliyun's extender carry only Aliyun's five annotations and read as
    one GPU with no per-container shares and no unit.
    """

    gpu_indices: tuple[int, ...]
    total: int
    """The pod's units of ``aliyun.com/gpu-mem`` over all its GPUs (Aliyun's ``ALIYUN_COM_GPU_MEM_POD``)."""
    gpu_memory: int
    """The first GPU's memory in units (Aliyun's ``ALIYUN_COM_GPU_MEM_DEV``)."""
    assume_time_ns: int
    container_shares: Mapping[str, int] = field(default_factory=dict)
    unit: MemoryUnit | None = None
    assigned: bool = False
    allocated_containers: tuple[str, ...] = ()
    """The GPU containers Allocate has served, in spec order (multi-container pods, one Allocate each)."""
    gpu_uuids: tuple[str, ...] = ()
    exclusive: bool = False
    """From the pod's request annotation, which the user writes; never encoded here."""
    compute_percent: int = 0
    """From the pod's request annotation, which the user writes; never encoded here."""
    compute_limit: int = 0
    """From the pod's request (``compute_share``), which the user writes; never encoded here."""
    sharing: Sharing = NO_SHARING
    """From the pod's request (``sharing_rules``), which the user writes; never encoded here."""

    @property
    def per_gpu(self) -> int:
        return self.total // max(len(self.gpu_indices), 1)

    def annotations(self) -> dict[str, str]:
        """The pod annotations that record this assignment: Aliyun's five, plus ours."""
        out = {
            ANN_IDX: str(self.gpu_indices[0]),
            ANN_POD: str(self.total),
            ANN_DEV: str(self.gpu_memory),
            ANN_ASSIGNED: "true" if self.assigned else "false",
            ANN_ASSUME_TIME: str(self.assume_time_ns),
            ANN_GPU_INDICES: ",".join(str(i) for i in self.gpu_indices),
        }
        if self.container_shares:
            out[ANN_CONTAINER_SHARES] = json.dumps(dict(self.container_shares), sort_keys=True, separators=(",", ":"))
        if self.unit is not None:
            out[ANN_MEMORY_UNIT] = self.unit.value
        if self.allocated_containers:
            out[ANN_ALLOCATED_CONTAINERS] = ",".join(self.allocated_containers)
        if self.gpu_uuids:
            out[ANN_GPU_UUIDS] = ",".join(self.gpu_uuids)
        return out


def new_assignment(request: PodRequest, gpu_indices: Iterable[int], gpu_memory: int, unit: MemoryUnit,
                   assume_time_ns: int) -> Assignment:
    """The assignment bind records for a pod placed on ``gpu_indices`` of a node advertising in ``unit``."""
    return Assignment(gpu_indices=tuple(gpu_indices), total=request.total, gpu_memory=gpu_memory,
                      assume_time_ns=assume_time_ns, container_shares=dict(request.container_shares), unit=unit,
                      exclusive=request.exclusive, compute_percent=request.compute_percent,
                      compute_limit=request.compute_limit, sharing=request.sharing)


def is_assigned(pod: PodInfo) -> bool:
    """Whether the device plugin has finished the pod's assignment (cheap: one annotation, no parsing)."""
    return pod.annotations.get(ANN_ASSIGNED, "false").strip().lower() == "true"


def _names(text: str) -> tuple[str, ...]:
    return tuple(p for p in (part.strip() for part in text.split(",")) if p)


def read_assignment(pod: PodInfo) -> Assignment | None:
    """The GPUs a bound pod holds, from its annotations; ``None`` if the extender never placed it or the
    annotations are not gpushare's (malformed values are treated as no assignment, never guessed)."""
    ann = pod.annotations
    if ANN_IDX not in ann:
        return None
    try:
        indices = tuple(int(i) for i in ann.get(ANN_GPU_INDICES, ann[ANN_IDX]).split(","))
        total = int(ann.get(ANN_POD, "0"))
        gpu_memory = int(ann.get(ANN_DEV, "0") or 0)
        shares = json.loads(ann[ANN_CONTAINER_SHARES]) if ANN_CONTAINER_SHARES in ann else {}
        container_shares = {str(k): int(v) for k, v in shares.items()}
        assume = int(ann.get(ANN_ASSUME_TIME, "0"))
        unit = MemoryUnit(ann[ANN_MEMORY_UNIT]) if ANN_MEMORY_UNIT in ann else None
        # RequestError is a ValueError too: a malformed compute or sharing value is no assignment either.
        compute, compute_limit = compute_share(pod)
        sharing = sharing_rules(pod)
    except (ValueError, AttributeError, TypeError):  # JSONDecodeError is a ValueError
        return None
    if any(i < 0 for i in indices) or total < 0:
        return None
    return Assignment(gpu_indices=indices, total=total, gpu_memory=gpu_memory, assume_time_ns=assume,
                      container_shares=container_shares, unit=unit, assigned=is_assigned(pod),
                      allocated_containers=_names(ann.get(ANN_ALLOCATED_CONTAINERS, "")),
                      gpu_uuids=_names(ann.get(ANN_GPU_UUIDS, "")), exclusive=_exclusive(ann),
                      compute_percent=compute, compute_limit=compute_limit, sharing=sharing)


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
        # Every GPU of a node (and of a fleet) names one of a few models: one copy of each name, not one per GPU.
        return cls(index=int(str(data["index"])), model=sys.intern(str(data.get("model", "unknown"))),
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


# Gangs: pods that start together (see docs/extender.md, "Gangs"). Two vocabularies name a gang: the coscheduling
# plugin of kubernetes-sigs/scheduler-plugins (a label naming a PodGroup, whose spec.minMember says how many must
# start at once; where the PodGroup CRD is absent, our annotation says it) and KubeShare 2.0's labels.
LABEL_POD_GROUP = "scheduling.x-k8s.io/pod-group"
ANN_GROUP_MIN_MEMBER = PREFIX + "group-min-member"
KUBESHARE_GROUP_NAME = "sharedgpu/group_name"
KUBESHARE_GROUP_HEADCOUNT = "sharedgpu/group_headcount"
KUBESHARE_GROUP_THRESHOLD = "sharedgpu/group_threshold"

# Far above any gang a cluster could place at once; it bounds the integers read from user text.
MAX_GANG_SIZE = 100_000


@dataclass(frozen=True)
class GangRef:
    """The gang a pod belongs to, as the pod itself says it.

    ``min_member`` is how many of its pods must be placed at once as the pod says it: KubeShare's labels, or for a
    coscheduling pod group the ``gpushare.io/group-min-member`` annotation, which counts only where no PodGroup
    object exists (the extender reads it); ``None`` when the pod says nothing.
    """

    namespace: str
    name: str
    min_member: int | None
    source: str
    """The label that named the gang, for sentences: ``scheduling.x-k8s.io/pod-group`` or ``sharedgpu/group_name``."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _whole(pod: PodInfo, where: str, name: str, text: str) -> int:
    stripped = text.strip()
    # At most 6 digits before int(): a 5,000-digit value is refused without converting it.
    if not stripped.isdigit() or len(stripped) > 6 or not 1 <= int(stripped) <= MAX_GANG_SIZE:
        raise RequestError(f"Pod {pod.key} has {where} {name}={clip(text)}; use a whole number of pods from 1 to "
                           f"{MAX_GANG_SIZE}.")
    return int(stripped)


def _kubeshare_min(pod: PodInfo) -> int:
    """KubeShare 2.0: ``ceil(headcount x threshold)`` pods start together; threshold 1 when absent."""
    headcount_text = pod.labels.get(KUBESHARE_GROUP_HEADCOUNT)
    if headcount_text is None:
        raise RequestError(f"Pod {pod.key} has label {KUBESHARE_GROUP_NAME} but no {KUBESHARE_GROUP_HEADCOUNT}; set "
                           "it to the number of pods in the group.")
    headcount = _whole(pod, "label", KUBESHARE_GROUP_HEADCOUNT, headcount_text)
    threshold_text = pod.labels.get(KUBESHARE_GROUP_THRESHOLD)
    if threshold_text is None:
        return headcount
    try:
        threshold = float(threshold_text.strip()) if len(threshold_text) <= 20 else math.nan
    except ValueError:
        threshold = math.nan
    if not 0 < threshold <= 1:  # NaN fails both comparisons
        raise RequestError(f"Pod {pod.key} has label {KUBESHARE_GROUP_THRESHOLD}={clip(threshold_text)}; use a "
                           "fraction of the group's headcount above 0 and at most 1 (1: every pod starts together).")
    return max(1, math.ceil(headcount * threshold - 1e-9))


def names_a_gang(pod: PodInfo) -> bool:
    """Whether the pod carries a gang label (valid or not): cheaper than ``read_gang``, for routing."""
    return LABEL_POD_GROUP in pod.labels or KUBESHARE_GROUP_NAME in pod.labels


def read_gang(pod: PodInfo) -> GangRef | None:
    """The pod's gang, or ``None`` when it names none; ``RequestError`` naming the field when a value is wrong."""
    group = pod.labels.get(LABEL_POD_GROUP)
    if group is not None:
        if not group.strip():
            raise RequestError(f"Pod {pod.key} has an empty label {LABEL_POD_GROUP}; set it to the name of its "
                               "PodGroup, or remove it.")
        text = pod.annotations.get(ANN_GROUP_MIN_MEMBER)
        minimum = None if text is None else _whole(pod, "annotation", ANN_GROUP_MIN_MEMBER, text)
        return GangRef(pod.namespace, group.strip(), minimum, LABEL_POD_GROUP)
    name = pod.labels.get(KUBESHARE_GROUP_NAME)
    if name is not None:
        if not name.strip():
            raise RequestError(f"Pod {pod.key} has an empty label {KUBESHARE_GROUP_NAME}; set it to the group's "
                               "name, or remove it.")
        return GangRef(pod.namespace, name.strip(), _kubeshare_min(pod), KUBESHARE_GROUP_NAME)
    return None
