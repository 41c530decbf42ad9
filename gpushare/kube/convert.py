"""Turn kubernetes client objects (or their JSON dicts) into the core's ``PodInfo``, ``NodeInfo`` and ``Budget``."""

from __future__ import annotations

from collections.abc import Mapping
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


def _strs(mapping: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in (mapping or {}).items()}


def _container(c: Any) -> ContainerInfo:
    resources = _get(c, "resources")
    return ContainerInfo(name=str(_get(c, "name")), limits=_strs(_get(resources, "limits")),
                         requests=_strs(_get(resources, "requests")))


def pod_info(pod: Any) -> PodInfo:
    meta = _get(pod, "metadata")
    spec = _get(pod, "spec")
    status = _get(pod, "status")
    return PodInfo(
        namespace=str(_get(meta, "namespace") or "default"),
        name=str(_get(meta, "name")),
        uid=str(_get(meta, "uid") or ""),
        node_name=_get(spec, "node_name", "nodeName"),
        phase=str(_get(status, "phase") or "Pending"),
        deleting=_get(meta, "deletion_timestamp", "deletionTimestamp") is not None,
        resource_version=str(_get(meta, "resource_version", "resourceVersion") or ""),
        annotations=_strs(_get(meta, "annotations")),
        labels=_strs(_get(meta, "labels")),
        containers=tuple(_container(c) for c in _get(spec, "containers") or ()),
        init_containers=tuple(_container(c) for c in _get(spec, "init_containers", "initContainers") or ()),
        priority=_priority(_get(spec, "priority")),
        preemption_policy=str(_get(spec, "preemption_policy", "preemptionPolicy") or ""),
        nominated_node=_get(status, "nominated_node_name", "nominatedNodeName") or None,
    )


def _priority(value: Any) -> int | None:
    # The API server stores an int32; a pod sent straight to the extender may carry anything.
    return value if type(value) is int else None


def node_info(node: Any) -> NodeInfo:
    meta = _get(node, "metadata")
    status = _get(node, "status")
    addresses = tuple(str(_get(a, "address")) for a in _get(status, "addresses") or ()
                      if _get(a, "type") == "InternalIP")
    return NodeInfo(
        name=str(_get(meta, "name")),
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
