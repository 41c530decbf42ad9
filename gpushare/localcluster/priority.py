"""PriorityClasses and the Priority admission plugin, as a real API server runs them (enabled by default).

A pod names a PriorityClass in ``spec.priorityClassName``; admission resolves it into ``spec.priority`` and
``spec.preemptionPolicy`` and refuses a pod that names a class that does not exist or sets either field to
something else. A pod naming no class gets the class marked ``globalDefault``, or priority 0. Two system
classes always exist. Their wording follows plugin/pkg/admission/priority and the scheduling API's validation.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpushare.localcluster import validation
from gpushare.localcluster.errors import ApiError

Obj = dict[str, Any]

HIGHEST_USER_DEFINABLE_PRIORITY = 1_000_000_000
SYSTEM_PREFIX = "system-"
SYSTEM_CLASSES = {"system-cluster-critical": 2_000_000_000, "system-node-critical": 2_000_001_000}
PREEMPTION_POLICIES = ("PreemptLowerPriority", "Never")
INT32 = (-(2**31), 2**31 - 1)


def system_classes() -> list[Obj]:
    """The built-in classes the API server creates at start-up."""
    return [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
             "value": value, "description": "Used for system critical pods that must not be moved from their "
             "current node." if name.endswith("node-critical") else "Used for system critical pods that must run "
             "in the cluster, but can be moved to another node if necessary.",
             "preemptionPolicy": "PreemptLowerPriority"} for name, value in SYSTEM_CLASSES.items()]


def decode_priority_class(obj: Obj) -> None:
    value = obj.get("value")
    if value is not None and (type(value) is not int or not INT32[0] <= value <= INT32[1]):
        raise validation.DecodeError("json: cannot unmarshal into Go struct field PriorityClass.value of type int32",
                                     "value")
    if "globalDefault" in obj and not isinstance(obj["globalDefault"], bool):
        raise validation.DecodeError("json: cannot unmarshal into Go struct field PriorityClass.globalDefault of "
                                     "type bool", "globalDefault")


def default_priority_class(obj: Obj) -> None:
    obj.setdefault("preemptionPolicy", "PreemptLowerPriority")


def validate_priority_class(obj: Obj) -> Iterable[validation.FieldError]:
    name = str(obj["metadata"].get("name") or "")
    value = obj.get("value")
    if value is None:
        yield validation.required("value")
        return
    if name.startswith(SYSTEM_PREFIX):
        if SYSTEM_CLASSES.get(name) != value:
            yield validation.forbidden("metadata.name", f"priority class names with '{SYSTEM_PREFIX}' prefix are "
                                       "reserved for system use only")
    elif value > HIGHEST_USER_DEFINABLE_PRIORITY:
        yield validation.forbidden("value", "maximum allowed value of a user defined priority is "
                                   f"{HIGHEST_USER_DEFINABLE_PRIORITY}")
    policy = obj.get("preemptionPolicy")
    if policy not in PREEMPTION_POLICIES:
        yield validation.not_supported("preemptionPolicy", str(policy), PREEMPTION_POLICIES)


def validate_priority_class_update(old: Obj, new: Obj) -> Iterable[validation.FieldError]:
    if old.get("value") != new.get("value"):
        yield validation.forbidden("value", "may not be changed in an update.")
    if old.get("preemptionPolicy") != new.get("preemptionPolicy"):
        yield validation.invalid_value("preemptionPolicy", str(new.get("preemptionPolicy")),
                                       "field is immutable")


def admit_priority_class(obj: Obj, existing: Iterable[Obj]) -> None:
    """Only one class may be the global default."""
    if not obj.get("globalDefault"):
        return
    for other in existing:
        if other.get("globalDefault") and other["metadata"]["name"] != obj["metadata"]["name"]:
            raise _forbidden("priorityclasses", "scheduling.k8s.io", obj["metadata"]["name"],
                             f"PriorityClass {other['metadata']['name']} is already marked as default. Only one "
                             "default can exist")


def admit_pod(pod: Obj, classes: Iterable[Obj]) -> None:
    """Resolve the pod's priority from its class, in place, or refuse it as the Priority plugin does."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return
    name = spec.get("priorityClassName") or ""
    by_name = {c["metadata"]["name"]: c for c in classes}
    pod_name = pod["metadata"]["name"]
    if name:
        chosen = by_name.get(name)
        if chosen is None:
            raise _forbidden("pods", "", pod_name, f"no PriorityClass with name {name} was found")
    else:
        chosen = next((c for c in by_name.values() if c.get("globalDefault")), None)
        if chosen is not None:
            spec["priorityClassName"] = chosen["metadata"]["name"]
    priority = int(chosen["value"]) if chosen is not None else 0
    policy = str(chosen.get("preemptionPolicy") or "PreemptLowerPriority") if chosen else "PreemptLowerPriority"
    if spec.get("priority") is not None and spec["priority"] != priority:
        raise _forbidden("pods", "", pod_name, f"the integer value of priority ({spec['priority']}) must not be "
                         f"provided in pod spec; priority admission controller computed {priority} from the given "
                         "PriorityClass name")
    if spec.get("preemptionPolicy") is not None and spec["preemptionPolicy"] != policy:
        raise _forbidden("pods", "", pod_name, f"the string value of PreemptionPolicy ({spec['preemptionPolicy']}) "
                         f"must not be provided in pod spec; priority admission controller computed {policy} from "
                         "the given PriorityClass name")
    spec["priority"] = priority
    spec["preemptionPolicy"] = policy


def _forbidden(resource: str, group: str, name: str, why: str) -> ApiError:
    qualified = f"{resource}.{group}" if group else resource
    return ApiError(403, "Forbidden", f'{qualified} "{name}" is forbidden: {why}',
                    {"name": name, "kind": resource, **({"group": group} if group else {})})
