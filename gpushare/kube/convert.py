"""Turn kubernetes client objects (or their JSON dicts) into the core's ``PodInfo``, ``NodeInfo`` and ``Budget``."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from gpushare.contract import ContainerInfo, NodeInfo, PodInfo
from gpushare.disruption import Budget, label_selector


def _get(obj: Any, snake: str, camel: str | None = None) -> Any:
    """Read a field from a client model object or from its JSON dict form."""
    if obj is None:
        return None
    # ``type(obj) is dict`` first: JSON from the wire and the watch is always a dict, and a check against the
    # Mapping ABC costs a Python-level call, dozens of times per pod.
    if type(obj) is dict or isinstance(obj, Mapping):
        return obj.get(camel or snake)
    return getattr(obj, snake, None)


# The pods of a workload repeat the same short strings (namespace, phase, container names, quantities, label values,
# node names) and the same containers, and each decoded event brings copies of its own: 60,000 pending pods took
# 100 MiB of the extender's memory, and left much of it in half-empty allocator pools once they were bound. Short
# strings and whole containers are shared instead (33 MiB for the same pods); a long string (a last-applied
# configuration, a node's GPU inventory) is rarely repeated and is kept as it came.
SHARED_MAX_CHARS = 64
# Distinct containers (name, limits, requests) shared at once: the workloads a cluster runs, with room to spare.
MAX_SHARED_CONTAINERS = 4096
_CONTAINERS: dict[tuple[str, tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]], ContainerInfo] = {}
# Most pods and nodes have no labels or annotations of some kind: one empty, read-only mapping for all of them.
_EMPTY: Mapping[str, str] = MappingProxyType({})


def _shared(value: Any) -> str:
    text = str(value)
    return sys.intern(text) if len(text) <= SHARED_MAX_CHARS else text


def _strs(mapping: Any) -> Mapping[str, str]:
    if not mapping:
        return _EMPTY
    return {_shared(k): _shared(v) for k, v in mapping.items()}


def _container(c: Any) -> ContainerInfo:
    """The container as its pod's workload has it: the replicas of a workload share one (read-only) object."""
    resources = _get(c, "resources")
    name = _shared(_get(c, "name"))
    limits, requests = _strs(_get(resources, "limits")), _strs(_get(resources, "requests"))
    key = (name, tuple(limits.items()), tuple(requests.items()))
    shared = _CONTAINERS.get(key)
    if shared is None:
        if len(_CONTAINERS) >= MAX_SHARED_CONTAINERS:
            _CONTAINERS.clear()  # a cluster of many workloads: sharing starts over, nothing is lost but memory
        shared = _CONTAINERS[key] = ContainerInfo(name=name, limits=limits, requests=requests)
    return shared


def pod_info(pod: Any) -> PodInfo:
    meta = _get(pod, "metadata")
    spec = _get(pod, "spec")
    status = _get(pod, "status")
    return PodInfo(
        namespace=_shared(_get(meta, "namespace") or "default"),
        name=str(_get(meta, "name")),
        uid=str(_get(meta, "uid") or ""),
        node_name=_node_name(_get(spec, "node_name", "nodeName")),
        phase=_shared(_get(status, "phase") or "Pending"),
        deleting=_get(meta, "deletion_timestamp", "deletionTimestamp") is not None,
        resource_version=str(_get(meta, "resource_version", "resourceVersion") or ""),
        annotations=_strs(_get(meta, "annotations")),
        labels=_strs(_get(meta, "labels")),
        containers=tuple(_container(c) for c in _get(spec, "containers") or ()),
        init_containers=tuple(_container(c) for c in _get(spec, "init_containers", "initContainers") or ()),
        priority=_priority(_get(spec, "priority")),
        preemption_policy=_shared(_get(spec, "preemption_policy", "preemptionPolicy") or ""),
        nominated_node=_node_name(_get(status, "nominated_node_name", "nominatedNodeName")),
    )


def _node_name(value: Any) -> str | None:
    return _shared(value) if value else None


def _priority(value: Any) -> int | None:
    # The API server stores an int32; a pod sent straight to the extender may carry anything.
    return value if type(value) is int else None


def node_info(node: Any) -> NodeInfo:
    meta = _get(node, "metadata")
    status = _get(node, "status")
    addresses = tuple(str(_get(a, "address")) for a in _get(status, "addresses") or ()
                      if _get(a, "type") == "InternalIP")
    return NodeInfo(
        name=_shared(_get(meta, "name")),
        labels=_strs(_get(meta, "labels")),
        annotations=_strs(_get(meta, "annotations")),
        capacity=_strs(_get(status, "capacity")),
        allocatable=_strs(_get(status, "allocatable")),
        addresses=addresses,
    )


def budget_info(pdb: Mapping[str, Any]) -> Budget:
    """A policy/v1 PodDisruptionBudget's JSON, as preemption reads it."""
    meta = pdb.get("metadata") or {}
    status = pdb.get("status") or {}
    allowed = status.get("disruptionsAllowed")
    return Budget(namespace=str(meta.get("namespace") or "default"), name=str(meta.get("name")),
                  selector=label_selector((pdb.get("spec") or {}).get("selector")),
                  disruptions_allowed=allowed if type(allowed) is int else 0,
                  disrupted_pods=frozenset(str(k) for k in status.get("disruptedPods") or {}))
