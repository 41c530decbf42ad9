"""Server-side printing: the ``meta.k8s.io/v1`` Table that ``kubectl get`` asks for.

kubectl sends ``Accept: application/json;as=Table;v=v1;g=meta.k8s.io`` and prints the columns it gets, so
the columns here mirror the ones a real API server returns for each kind.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from gpushare.localcluster.resources import (
    BUDGETS,
    CONFIGMAPS,
    EVENTS,
    LEASES,
    NAMESPACES,
    NODES,
    PODS,
    PRIORITY_CLASSES,
    Obj,
    Resource,
)

TABLE_CONTENT_TYPE = b"application/json;as=Table;v=v1;g=meta.k8s.io"

Column = tuple[str, str, int, Callable[[Obj, datetime], Any]]  # name, type, priority, cell


def age(timestamp: str | None, now: datetime) -> str:
    """A short human duration like kubectl's: 45s, 3m20s, 5h, 12d."""
    if not timestamp:
        return "<unknown>"
    try:
        then = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return "<unknown>"
    seconds = max(int((now - then).total_seconds()), 0)
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if hours < 3:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if days < 2:
        return f"{hours}h"
    if days < 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    return f"{days}d"


def _meta(obj: Obj, key: str) -> Any:
    return obj.get("metadata", {}).get(key)


def _name(obj: Obj, now: datetime) -> Any:
    return _meta(obj, "name")


def _age(obj: Obj, now: datetime) -> Any:
    return age(_meta(obj, "creationTimestamp"), now)


def _pod_ready(obj: Obj, now: datetime) -> str:
    statuses = obj.get("status", {}).get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    return f"{ready}/{len(obj.get('spec', {}).get('containers') or [])}"


def _pod_status(obj: Obj, now: datetime) -> str:
    if _meta(obj, "deletionTimestamp"):
        return "Terminating"
    status = obj.get("status", {})
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            return str(waiting["reason"])
    return str(status.get("reason") or status.get("phase") or "Unknown")


def _pod_restarts(obj: Obj, now: datetime) -> int:
    return sum(int(s.get("restartCount") or 0) for s in obj.get("status", {}).get("containerStatuses") or [])


def _node_status(obj: Obj, now: datetime) -> str:
    ready = next((c for c in obj.get("status", {}).get("conditions") or [] if c.get("type") == "Ready"), None)
    text = "Ready" if ready and ready.get("status") == "True" else ("NotReady" if ready else "Unknown")
    return text + (",SchedulingDisabled" if obj.get("spec", {}).get("unschedulable") else "")


def _node_roles(obj: Obj, now: datetime) -> str:
    prefix = "node-role.kubernetes.io/"
    roles = sorted(k[len(prefix):] for k in _meta(obj, "labels") or {} if k.startswith(prefix))
    return ",".join(roles) or "<none>"


def _node_address(kind: str) -> Callable[[Obj, datetime], str]:
    def cell(obj: Obj, now: datetime) -> str:
        addresses = obj.get("status", {}).get("addresses") or []
        return next((str(a.get("address")) for a in addresses if a.get("type") == kind), "<none>")

    return cell


def _field(*keys: str, default: str = "<none>") -> Callable[[Obj, datetime], Any]:
    def cell(obj: Obj, now: datetime) -> Any:
        value: Any = obj
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return default if value in (None, "") else value

    return cell


def _event_object(obj: Obj, now: datetime) -> str:
    involved = obj.get("involvedObject") or {}
    return f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}"


def _event_last_seen(obj: Obj, now: datetime) -> str:
    return age(obj.get("lastTimestamp") or obj.get("eventTime") or _meta(obj, "creationTimestamp"), now)


NAME: Column = ("Name", "string", 0, _name)
AGE: Column = ("Age", "string", 0, _age)
COLUMNS: dict[Resource, tuple[Column, ...]] = {
    PODS: (NAME, ("Ready", "string", 0, _pod_ready), ("Status", "string", 0, _pod_status),
           ("Restarts", "integer", 0, _pod_restarts), AGE, ("IP", "string", 1, _field("status", "podIP")),
           ("Node", "string", 1, _field("spec", "nodeName")),
           ("Nominated Node", "string", 1, _field("status", "nominatedNodeName"))),
    NODES: (NAME, ("Status", "string", 0, _node_status), ("Roles", "string", 0, _node_roles), AGE,
            ("Version", "string", 0, _field("status", "nodeInfo", "kubeletVersion", default="")),
            ("Internal-IP", "string", 1, _node_address("InternalIP")),
            ("External-IP", "string", 1, _node_address("ExternalIP")),
            ("OS-Image", "string", 1, _field("status", "nodeInfo", "osImage", default="<unknown>")),
            ("Kernel-Version", "string", 1, _field("status", "nodeInfo", "kernelVersion", default="<unknown>")),
            ("Container-Runtime", "string", 1,
             _field("status", "nodeInfo", "containerRuntimeVersion", default="<unknown>"))),
    NAMESPACES: (NAME, ("Status", "string", 0, _field("status", "phase", default="")), AGE),
    CONFIGMAPS: (NAME, ("Data", "integer", 0, lambda o, n: len(o.get("data") or {}) + len(o.get("binaryData") or {})),
                 AGE),
    EVENTS: (("Last Seen", "string", 0, _event_last_seen), ("Type", "string", 0, _field("type", default="")),
             ("Reason", "string", 0, _field("reason", default="")), ("Object", "string", 0, _event_object),
             ("Message", "string", 0, _field("message", default=""))),
    LEASES: (NAME, ("Holder", "string", 0, _field("spec", "holderIdentity", default="")), AGE),
    PRIORITY_CLASSES: (NAME, ("Value", "integer", 0, _field("value", default="")),
                       ("Global-Default", "boolean", 0, lambda o, n: bool(o.get("globalDefault"))), AGE,
                       ("PreemptionPolicy", "string", 0, _field("preemptionPolicy", default=""))),
    BUDGETS: (NAME, ("Min Available", "string", 0, _field("spec", "minAvailable", default="N/A")),
              ("Max Unavailable", "string", 0, _field("spec", "maxUnavailable", default="N/A")),
              ("Allowed Disruptions", "integer", 0, _field("status", "disruptionsAllowed", default="0")), AGE),
}


def _row_object(obj: Obj, include: str) -> Obj | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj.get("metadata", {})}


def table(resource: Resource, objects: list[Obj], version: str, include_object: str = "Metadata") -> Obj:
    """A Table of ``objects``; ``include_object`` is the request's ``includeObject`` (None, Metadata, Object)."""
    columns = COLUMNS[resource]
    now = datetime.now(UTC)
    definitions = [{"name": name, "type": type_, "format": "name" if name == "Name" else "", "description": name,
                    "priority": priority} for name, type_, priority, _ in columns]
    rows = []
    for obj in objects:
        row: Obj = {"cells": [cell(obj, now) for _, _, _, cell in columns]}
        embedded = _row_object(obj, include_object)
        if embedded is not None:
            row["object"] = embedded
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": version},
            "columnDefinitions": definitions, "rows": rows}
