"""kube-scheduler's HTTP extender messages (k8s.io/kube-scheduler/extender/v1) as raw JSON, checked at the door.

The Go structs have no json tags, so keys are Go field names (``NodeNames``, ``FailedNodes``...). Bodies are
parsed with orjson and every field the extender reads is checked for its shape before anything uses it: the
pod's metadata, spec and containers, names as Kubernetes spells them, node lists without repeats and within
``MAX_NODES``. A message that fails is a ``BadRequest`` whose sentence names the field and what is allowed,
with any user text clipped (``gpushare.logs.clip``). Node names are checked for type, count and repeats here,
in C-level passes; their spelling is checked only for names the cache does not know (``check_node_names``),
because a name the cache holds came from the API server, and a pass over 5,000 names costs as much as the
filter itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gpushare.contract import MAX_PRIORITY, MIN_PRIORITY, PodInfo
from gpushare.kube.convert import pod_info
from gpushare.logs import clip

NODE_NAMES_SHAPE = "ExtenderArgs.NodeNames must be a list of node names (strings)."

# More nodes than any Kubernetes cluster runs (the largest supported ones have 15,000 to 65,000); a longer list
# can only be a mistake or an attack, and scoring it would hold a worker for seconds.
MAX_NODES = 100_000

# Kubernetes' own name rules (apimachinery validation): DNS-1123 subdomains for pods and nodes, labels for
# namespaces and container names.
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
SUBDOMAIN_MAX = 253
LABEL_MAX = 63
# Pod UIDs are UUIDs (36 characters); the API server accepts any string, so allow some room, but no essay.
UID_MAX = 128
# Kubernetes caps all annotations of an object at 256 KiB together.
ANNOTATIONS_MAX_BYTES = 256 * 1024


class BadRequest(ValueError):
    """A request body that is not the message kube-scheduler sends; answered with HTTP 400."""


def subdomain_problem(name: str) -> str | None:
    """Why ``name`` is not a DNS-1123 subdomain (pod and node names), or ``None``."""
    if not name:
        return "must not be empty"
    if len(name) > SUBDOMAIN_MAX:
        return f"is {len(name)} characters long; Kubernetes allows at most {SUBDOMAIN_MAX}"
    if not _SUBDOMAIN.fullmatch(name):
        return ("must be a DNS subdomain: lower-case letters, digits, '-' and '.', starting and ending with a letter "
                "or digit")
    return None


def label_problem(name: str) -> str | None:
    """Why ``name`` is not a DNS-1123 label (namespaces, container names), or ``None``."""
    if not name:
        return "must not be empty"
    if len(name) > LABEL_MAX:
        return f"is {len(name)} characters long; Kubernetes allows at most {LABEL_MAX}"
    if not _LABEL.fullmatch(name):
        return "must be a DNS label: lower-case letters, digits and '-', starting and ending with a letter or digit"
    return None


def _name(value: object, field: str, problem: Any = subdomain_problem) -> str:
    if type(value) is not str:
        raise BadRequest(f"{field} must be a string, not {_kind(value)}.")
    why = problem(value)
    if why is not None:
        raise BadRequest(f"{field} {clip(value)} {why}.")
    return value


def check_node_names(names: Iterable[str], field: str = "ExtenderArgs.NodeNames") -> None:
    """``BadRequest`` for the first name that is not a node name Kubernetes would accept."""
    for name in names:
        _name(name, f"{field} entry")


def _kind(value: object) -> str:
    """A JSON type's name as the sender wrote it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _obj(value: object, field: str, required: bool = True) -> dict[str, Any]:
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"{field} must be an object, not {_kind(value)}.")
    return value


def _opt_str(value: object, field: str, limit: int) -> None:
    if value is None:
        return
    if type(value) is not str:
        raise BadRequest(f"{field} must be a string, not {_kind(value)}.")
    if len(value) > limit:
        raise BadRequest(f"{field} is {len(value)} characters long; at most {limit} are allowed.")


def _string_map(value: object, field: str) -> None:
    mapping = _obj(value, field, required=False)
    size = 0
    for key, item in mapping.items():
        if type(item) is not str:
            raise BadRequest(f"{field}[{clip(key)}] must be a string, not {_kind(item)}.")
        size += len(key) + len(item)
    if size > ANNOTATIONS_MAX_BYTES:
        raise BadRequest(f"{field} holds {size} characters; Kubernetes allows at most {ANNOTATIONS_MAX_BYTES}.")


def _quantities(value: object, field: str) -> None:
    for resource, amount in _obj(value, field, required=False).items():
        # Quantities travel as strings; Kubernetes' JSON decoder takes bare numbers too.
        if type(amount) is not str and (not isinstance(amount, int | float) or isinstance(amount, bool)):
            raise BadRequest(f"{field}[{clip(resource)}] must be a quantity such as \"2\" or \"500m\", not "
                             f"{_kind(amount)}.")


def _containers(value: object, field: str, required: bool) -> None:
    if value is None and not required:
        return
    if not isinstance(value, list):
        raise BadRequest(f"{field} must be a list of containers (objects), not {_kind(value)}.")
    for i, container in enumerate(value):
        where = f"{field}[{i}]"
        item = _obj(container, where)
        _name(item.get("name"), f"{where}.name", label_problem)
        resources = _obj(item.get("resources"), f"{where}.resources", required=False)
        _quantities(resources.get("limits"), f"{where}.resources.limits")
        _quantities(resources.get("requests"), f"{where}.resources.requests")


def check_pod(raw: object, field: str) -> dict[str, Any]:
    """The pod's JSON, checked in every field the extender reads; ``BadRequest`` naming the first bad one."""
    pod = _obj(raw, field)
    meta = _obj(pod.get("metadata"), f"{field}.metadata")
    _name(meta.get("name"), f"{field}.metadata.name")
    if meta.get("namespace") is not None:
        _name(meta.get("namespace"), f"{field}.metadata.namespace", label_problem)
    _opt_str(meta.get("uid"), f"{field}.metadata.uid", UID_MAX)
    _opt_str(meta.get("resourceVersion"), f"{field}.metadata.resourceVersion", UID_MAX)
    _string_map(meta.get("annotations"), f"{field}.metadata.annotations")
    _string_map(meta.get("labels"), f"{field}.metadata.labels")
    spec = _obj(pod.get("spec"), f"{field}.spec")
    if spec.get("nodeName") is not None:
        _name(spec.get("nodeName"), f"{field}.spec.nodeName")
    _containers(spec.get("containers"), f"{field}.spec.containers", required=True)
    _containers(spec.get("initContainers"), f"{field}.spec.initContainers", required=False)
    priority = spec.get("priority")
    if priority is not None and (type(priority) is not int or not MIN_PRIORITY <= priority <= MAX_PRIORITY):
        raise BadRequest(f"{field}.spec.priority must be a whole number from {MIN_PRIORITY} to {MAX_PRIORITY}, not "
                         f"{clip(repr(priority))}.")
    _opt_str(spec.get("preemptionPolicy"), f"{field}.spec.preemptionPolicy", LABEL_MAX)
    status = _obj(pod.get("status"), f"{field}.status", required=False)
    _opt_str(status.get("phase"), f"{field}.status.phase", LABEL_MAX)
    if status.get("nominatedNodeName"):
        _name(status.get("nominatedNodeName"), f"{field}.status.nominatedNodeName")
    return pod


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """ExtenderArgs: the pod and its candidate nodes, by name (nodeCacheCapable) or as a v1.NodeList."""

    pod: PodInfo
    node_names: list[str] | None
    node_list: dict[str, Any] | None
    items: list[dict[str, Any]]
    names: list[str]
    """The candidate node names, in either mode: distinct strings, at most ``MAX_NODES``."""


@dataclass(frozen=True, slots=True)
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


def _object(body: bytes, what: str) -> dict[str, Any]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"The request body is not valid JSON ({exc}); send {what} as kube-scheduler does.") from None
    if not isinstance(data, dict):
        raise BadRequest(f"The request body must be a JSON object ({what}), not {_kind(data)}.")
    return data


def _distinct(names: list[str], field: str) -> None:
    """Count and repeats in C-level passes; ``names`` must already be strings."""
    if len(names) > MAX_NODES:
        raise BadRequest(f"{field} lists {len(names)} nodes; at most {MAX_NODES} are allowed.")
    if len(set(names)) == len(names):
        return
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise BadRequest(f"{field} lists node {clip(name)} more than once; list each candidate node once.")
        seen.add(name)


def parse_extender_args(body: bytes) -> ExtenderArgs:
    data = _object(body, "ExtenderArgs {Pod, Nodes, NodeNames}")
    raw_pod = check_pod(data.get("Pod"), "ExtenderArgs.Pod")
    pod = pod_info(raw_pod)
    names = data.get("NodeNames")
    node_list = data.get("Nodes")
    if names is not None:
        # The set of the names' types, in one C-level pass: orjson makes every JSON string an exact str.
        if not isinstance(names, list) or not {*map(type, names)} <= {str}:
            raise BadRequest(NODE_NAMES_SHAPE)
        _distinct(names, "ExtenderArgs.NodeNames")
        return ExtenderArgs(pod, names, None, [], names)
    if node_list is None:
        raise BadRequest("ExtenderArgs carries neither NodeNames (nodeCacheCapable: true) nor Nodes "
                         "(nodeCacheCapable: false); send one of them.")
    items = _obj(node_list, "ExtenderArgs.Nodes").get("items")
    if items is None:
        items = []
    if not isinstance(items, list) or not all(
            isinstance(i, dict) and isinstance(i.get("metadata"), dict) and type(i["metadata"].get("name")) is str
            for i in items):
        raise BadRequest("ExtenderArgs.Nodes must be a v1.NodeList whose items each have metadata.name.")
    listed = [item["metadata"]["name"] for item in items]
    _distinct(listed, "ExtenderArgs.Nodes.items")
    return ExtenderArgs(pod, None, node_list, items, listed)


def parse_binding_args(body: bytes) -> BindingArgs:
    data = _object(body, "ExtenderBindingArgs {PodName, PodNamespace, PodUID, Node}")
    name = _name(data.get("PodName"), "ExtenderBindingArgs.PodName")
    namespace = _name(data.get("PodNamespace"), "ExtenderBindingArgs.PodNamespace", label_problem)
    uid = data.get("PodUID")
    if type(uid) is not str:
        raise BadRequest(f"ExtenderBindingArgs.PodUID must be a string (the pod's UID), not {_kind(uid)}.")
    _opt_str(uid, "ExtenderBindingArgs.PodUID", UID_MAX)
    node = _name(data.get("Node"), "ExtenderBindingArgs.Node")
    return BindingArgs(name, namespace, uid, node)


def filter_result(args: ExtenderArgs, passed: list[str] | None, failed: dict[str, str],
                  unresolvable: dict[str, str], error: str = "") -> dict[str, Any]:
    """ExtenderFilterResult in the same mode as the request; ``passed=None`` when ``error`` is set."""
    nodes: dict[str, Any] | None = None
    names: list[str] | None = None
    if passed is not None:
        if args.node_names is not None:
            names = passed
        else:
            keep = set(passed)
            nodes = dict(args.node_list or {})
            nodes["items"] = [item for item in args.items if item["metadata"]["name"] in keep]
    return {"Nodes": nodes, "NodeNames": names, "FailedNodes": failed,
            "FailedAndUnresolvableNodes": unresolvable, "Error": error}


def host_priority_list(scores: Mapping[int, Sequence[str]]) -> bytes:
    """HostPriorityList, ``[{"Host": name, "Score": score}, ...]``, from each score's node names.

    The names must be node names Kubernetes accepts (DNS subdomains: nothing JSON escapes), as every name
    prioritize answers for is: a node of the cache, or a name ``check_node_names`` passed. Written per score
    with C-level joins: prioritize answers for hundreds of nodes per pod, and a dict per host cost more than
    deciding their scores.
    """
    groups = []
    for score, names in scores.items():
        if names:
            tail = f'","Score":{score}}}'
            groups.append('{"Host":"' + f'{tail},{{"Host":"'.join(names) + tail)
    return f"[{','.join(groups)}]".encode()


@dataclass(frozen=True, slots=True)
class PreemptionArgs:
    """ExtenderPreemptionArgs: the preemptor and, per candidate node, kube-scheduler's victims by UID."""

    pod: PodInfo
    victims: dict[str, tuple[tuple[str, ...], int]]
    """Node name -> (the UIDs of kube-scheduler's victims there, in its order, and its PodDisruptionBudget
    violation count for them)."""


def _victims(value: object, field: str, uid_of: Any) -> tuple[tuple[str, ...], int]:
    entry = _obj(value, field)
    pods = entry.get("Pods")
    if pods is None:
        pods = []
    if not isinstance(pods, list):
        raise BadRequest(f"{field}.Pods must be a list, not {_kind(pods)}.")
    uids = tuple(uid_of(pod, f"{field}.Pods[{i}]") for i, pod in enumerate(pods))
    violations = entry.get("NumPDBViolations", 0)
    if type(violations) is not int or violations < 0:
        raise BadRequest(f"{field}.NumPDBViolations must be a whole number of 0 or more, not {_kind(violations)}.")
    return uids, violations


def _meta_uid(value: object, field: str) -> str:
    uid = _obj(value, field).get("UID")
    if type(uid) is not str or not uid:
        raise BadRequest(f"{field}.UID must be a pod's UID (a non-empty string), not {_kind(uid)}.")
    _opt_str(uid, f"{field}.UID", UID_MAX)
    return uid


def _pod_uid(value: object, field: str) -> str:
    meta = _obj(_obj(value, field).get("metadata"), f"{field}.metadata")
    return _meta_uid({"UID": meta.get("uid")}, f"{field}.metadata")


def parse_preemption_args(body: bytes) -> PreemptionArgs:
    """Either form kube-scheduler sends: ``NodeNameToMetaVictims`` (nodeCacheCapable) or ``NodeNameToVictims``."""
    data = _object(body, "ExtenderPreemptionArgs {Pod, NodeNameToVictims, NodeNameToMetaVictims}")
    pod = pod_info(check_pod(data.get("Pod"), "ExtenderPreemptionArgs.Pod"))
    meta, full = data.get("NodeNameToMetaVictims"), data.get("NodeNameToVictims")
    if meta is not None:
        field, nodes, uid_of = "ExtenderPreemptionArgs.NodeNameToMetaVictims", meta, _meta_uid
    elif full is not None:
        field, nodes, uid_of = "ExtenderPreemptionArgs.NodeNameToVictims", full, _pod_uid
    else:
        raise BadRequest("ExtenderPreemptionArgs carries neither NodeNameToMetaVictims (nodeCacheCapable: true) nor "
                         "NodeNameToVictims (nodeCacheCapable: false); send one of them.")
    nodes = _obj(nodes, field)
    if len(nodes) > MAX_NODES:
        raise BadRequest(f"{field} lists {len(nodes)} nodes; at most {MAX_NODES} are allowed.")
    check_node_names(nodes, f"{field} key")
    return PreemptionArgs(pod, {name: _victims(entry, f"{field}[{name}]", uid_of) for name, entry in nodes.items()})


def preemption_result(victims: dict[str, tuple[Sequence[str], int]]) -> dict[str, Any]:
    """ExtenderPreemptionResult, always in the meta form kube-scheduler reads back (pods by UID)."""
    return {"NodeNameToMetaVictims": {node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": violations}
                                      for node, (uids, violations) in victims.items()}}
