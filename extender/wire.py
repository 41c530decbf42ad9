"""kube-scheduler's HTTP extender messages (k8s.io/kube-scheduler/extender/v1) as raw JSON.

The Go structs have no json tags, so keys are Go field names (``NodeNames``, ``FailedNodes``...). Bodies
are parsed with orjson and only the fields the extender reads are checked: validating a 5,000-node list
field by field would cost more than the decision itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gpushare.contract import PodInfo
from gpushare.kube.convert import pod_info

NODE_NAMES_SHAPE = "ExtenderArgs.NodeNames must be a list of node names (strings)."


class BadRequest(ValueError):
    """A request body that is not the message kube-scheduler sends; answered with HTTP 400."""


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """ExtenderArgs: the pod and its candidate nodes, by name (nodeCacheCapable) or as a v1.NodeList."""

    pod: PodInfo
    node_names: list[str] | None
    node_list: dict[str, Any] | None
    items: list[dict[str, Any]]

    @property
    def names(self) -> list[str]:
        if self.node_names is not None:
            return self.node_names
        return [item["metadata"]["name"] for item in self.items]


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
        raise BadRequest(f"The request body must be a JSON object ({what}), not {type(data).__name__}.")
    return data


def parse_extender_args(body: bytes) -> ExtenderArgs:
    data = _object(body, "ExtenderArgs {Pod, Nodes, NodeNames}")
    raw_pod = data.get("Pod")
    if not isinstance(raw_pod, dict) or not isinstance(raw_pod.get("metadata"), dict):
        raise BadRequest("ExtenderArgs.Pod must be a v1.Pod object with metadata.")
    try:
        pod = pod_info(raw_pod)
    except (AttributeError, TypeError, ValueError) as exc:
        raise BadRequest(f"ExtenderArgs.Pod is not a valid v1.Pod ({exc}).") from None
    names = data.get("NodeNames")
    node_list = data.get("Nodes")
    if names is not None:
        # Only the list itself is checked here: the names are checked as the filter meets them, because a
        # pass over 5,000 names costs as much as the filter itself.
        if not isinstance(names, list):
            raise BadRequest(NODE_NAMES_SHAPE)
        return ExtenderArgs(pod, names, None, [])
    if node_list is None:
        raise BadRequest("ExtenderArgs carries neither NodeNames (nodeCacheCapable: true) nor Nodes "
                         "(nodeCacheCapable: false); send one of them.")
    items = node_list.get("items") if isinstance(node_list, dict) else None
    if items is None and isinstance(node_list, dict):
        items = []
    if not isinstance(items, list) or not all(
            isinstance(i, dict) and isinstance(i.get("metadata"), dict) and type(i["metadata"].get("name")) is str
            for i in items):
        raise BadRequest("ExtenderArgs.Nodes must be a v1.NodeList whose items each have metadata.name.")
    return ExtenderArgs(pod, None, node_list, items)


def parse_binding_args(body: bytes) -> BindingArgs:
    data = _object(body, "ExtenderBindingArgs {PodName, PodNamespace, PodUID, Node}")
    fields = {}
    for key in ("PodName", "PodNamespace", "PodUID", "Node"):
        value = data.get(key)
        if not isinstance(value, str) or (not value and key != "PodUID"):
            raise BadRequest(f"ExtenderBindingArgs.{key} must be a non-empty string.")
        fields[key] = value
    return BindingArgs(fields["PodName"], fields["PodNamespace"], fields["PodUID"], fields["Node"])


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
