"""The kinds the local cluster serves, with their discovery data, field selectors, defaults and validation."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpushare.localcluster import budgets, priority, validation
from gpushare.localcluster.errors import ApiError, forbidden, invalid

Obj = dict[str, Any]
FieldGetter = Callable[[Obj], str]

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
SUBRESOURCE_VERBS = ("get", "patch", "update")
PROTECTED_NAMESPACES = ("default", "kube-system", "kube-public")
INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


def _path(*keys: str) -> FieldGetter:
    def get(obj: Obj) -> str:
        value: Any = obj
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    return get


_META_FIELDS: Mapping[str, FieldGetter] = {"metadata.name": _path("metadata", "name"),
                                           "metadata.namespace": _path("metadata", "namespace")}


def _fields(*names: str) -> Mapping[str, FieldGetter]:
    return {**_META_FIELDS, **{name: _path(*name.split(".")) for name in names}}


@dataclass(frozen=True, eq=False)
class Resource:
    """One served kind; compared and hashed by identity (there is one instance per kind)."""

    plural: str
    singular: str
    kind: str
    namespaced: bool
    group: str = ""
    version: str = "v1"
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    fields: Mapping[str, FieldGetter] = field(default_factory=lambda: _META_FIELDS)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return self.kind + "List"

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources


PODS = Resource("pods", "pod", "Pod", True, short_names=("po",), subresources=("status", "binding"),
                fields=_fields("spec.nodeName", "spec.restartPolicy", "spec.schedulerName",
                               "spec.serviceAccountName", "spec.hostNetwork", "status.phase", "status.podIP",
                               "status.nominatedNodeName"))
NODES = Resource("nodes", "node", "Node", False, short_names=("no",), subresources=("status",),
                 fields=_fields("spec.unschedulable"))
NAMESPACES = Resource("namespaces", "namespace", "Namespace", False, short_names=("ns",), subresources=("status",),
                      fields=_fields("status.phase"))
CONFIGMAPS = Resource("configmaps", "configmap", "ConfigMap", True, short_names=("cm",))
EVENTS = Resource("events", "event", "Event", True, short_names=("ev",),
                  fields={**_fields("involvedObject.kind", "involvedObject.namespace", "involvedObject.name",
                                    "involvedObject.uid", "involvedObject.apiVersion",
                                    "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason",
                                    "reportingComponent", "type"),
                          "source": _path("source", "component")})
LEASES = Resource("leases", "lease", "Lease", True, group="coordination.k8s.io")
PRIORITY_CLASSES = Resource("priorityclasses", "priorityclass", "PriorityClass", False, group="scheduling.k8s.io",
                            short_names=("pc",))
BUDGETS = Resource("poddisruptionbudgets", "poddisruptionbudget", "PodDisruptionBudget", True, group="policy",
                   short_names=("pdb",), subresources=("status",))

# scheduler-plugins' coscheduling PodGroup: a CRD, served only by clusters started with it (``LocalCluster(crds=...)``),
# so that a cluster without it answers 404 as a real one without the CRD does.
PODGROUPS = Resource("podgroups", "podgroup", "PodGroup", True, group="scheduling.x-k8s.io", version="v1alpha1",
                     short_names=("pg", "pgs"), subresources=("status",))

RESOURCES = (PODS, NODES, NAMESPACES, CONFIGMAPS, EVENTS, LEASES, PRIORITY_CLASSES, BUDGETS)
CRDS = (PODGROUPS,)
BY_PATH = {(r.group, r.version, r.plural): r for r in RESOURCES + CRDS}

def check_name(resource: Resource, name: str) -> None:
    """Namespaces need a DNS label; every other kind a DNS subdomain, as in Kubernetes."""
    problems = (validation.dns_label_errors(name) if resource is NAMESPACES
                else validation.dns_subdomain_errors(name))
    if problems:
        raise validation.invalid_object(resource.kind, resource.group, name,
                                        [validation.invalid_value("metadata.name", name, p) for p in problems])


def _default_container(container: Obj) -> None:
    """Requests default to limits, resource by resource, as the API server's defaulting does."""
    resources = container.get("resources")
    if not isinstance(resources, dict) or not isinstance(resources.get("limits"), dict):
        return
    requests = resources.get("requests")
    requests = dict(requests) if isinstance(requests, dict) else {}
    for name, value in resources["limits"].items():
        requests.setdefault(name, value)
    container["resources"] = {**resources, "requests": requests}


def _default_pod(obj: Obj) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    spec = dict(spec)
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    for key in ("containers", "initContainers"):
        if isinstance(spec.get(key), list):
            spec[key] = [dict(c) if isinstance(c, dict) else c for c in spec[key]]
            for container in spec[key]:
                if isinstance(container, dict):
                    _default_container(container)
    obj["spec"] = spec


def apply_defaults(resource: Resource, obj: Obj) -> None:
    """Fill defaulted fields of a new object (owned by the caller) in place."""
    if resource is PODS:
        _default_pod(obj)
    elif resource is PRIORITY_CLASSES:
        priority.default_priority_class(obj)


def _qos_class(spec: Obj) -> str:
    containers = [c for c in spec.get("containers", []) if isinstance(c, dict)]
    resources = [c.get("resources") or {} for c in containers]
    requests = [r.get("requests") or {} for r in resources]
    limits = [r.get("limits") or {} for r in resources]
    if not any(r.get(n) for r in requests + limits for n in ("cpu", "memory")):
        return "BestEffort"
    guaranteed = all(lim.get(n) and lim.get(n) == req.get(n, lim.get(n))
                     for req, lim in zip(requests, limits, strict=True) for n in ("cpu", "memory"))
    return "Guaranteed" if guaranteed else "Burstable"


def prepare_create(resource: Resource, obj: Obj) -> None:
    """Reset what a client may not set at creation, as the real registry strategies do."""
    if resource is PODS:
        obj["status"] = {"phase": "Pending", "qosClass": _qos_class(obj.get("spec") or {})}
    elif resource is NAMESPACES:
        spec = dict(obj.get("spec") or {})
        spec.setdefault("finalizers", ["kubernetes"])
        obj["spec"] = spec
        obj["status"] = {"phase": "Active"}
    elif resource is BUDGETS:
        budgets.prepare_budget(obj)


def admit(resource: Resource, obj: Obj, classes: Callable[[], list[Obj]]) -> None:
    """The admission plugins a real API server runs by default that change what gpushare sees: Priority."""
    if resource is PODS:
        priority.admit_pod(obj, classes())
    elif resource is PRIORITY_CLASSES:
        priority.admit_priority_class(obj, classes())


def decode(resource: Resource, obj: Obj) -> None:
    """What decoding the body into Go types does: 400 for a wrong JSON type or a quantity that does not parse,
    and quantities rewritten in canonical form. ``obj`` is owned by the caller and changed in place."""
    try:
        validation.decode_metadata(obj["metadata"])
        if resource is PODS:
            validation.decode_pod(obj)
        elif resource is NODES:
            validation.decode_node(obj)
        elif resource is CONFIGMAPS:
            validation.decode_string_map(obj, "data", "ConfigMap", "data")
        elif resource is PRIORITY_CLASSES:
            priority.decode_priority_class(obj)
        elif resource is BUDGETS:
            budgets.decode_budget(obj)
    except validation.DecodeError as exc:
        raise validation.decode_error(resource.kind, resource.version, exc) from None


def validate(resource: Resource, obj: Obj) -> None:
    """Reject, with every problem at once, what the real API server rejects for the fields gpushare uses."""
    errors = list(validation.validate_metadata(obj["metadata"]))
    if resource is PODS:
        errors.extend(validation.validate_pod_spec(obj.get("spec")))
    elif resource is NODES:
        errors.extend(validation.validate_node_resources(obj.get("status")))
    elif resource is PRIORITY_CLASSES:
        errors.extend(priority.validate_priority_class(obj))
    elif resource is BUDGETS:
        errors.extend(budgets.validate_budget(obj))
    elif resource is PODGROUPS:
        errors.extend(validation.validate_podgroup_spec(obj.get("spec")))
    if errors:
        raise validation.invalid_object(resource.kind, resource.group, obj["metadata"]["name"], errors)


_MUTABLE_POD_SPEC = ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds")


def _pod_spec_without_mutable(spec: Any) -> Any:
    if not isinstance(spec, dict):
        return spec
    out = {k: v for k, v in spec.items() if k not in _MUTABLE_POD_SPEC}
    for key in ("containers", "initContainers"):
        if isinstance(out.get(key), list):
            out[key] = [{k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c for c in out[key]]
    return out


def validate_update(resource: Resource, old: Obj, new: Obj) -> None:
    """Pod specs are immutable apart from images, tolerations and deadlines; binding goes through Binding.
    A PriorityClass keeps its value and preemption policy."""
    if resource is PRIORITY_CLASSES:
        errors = list(priority.validate_priority_class_update(old, new))
        if errors:
            raise validation.invalid_object(resource.kind, resource.group, new["metadata"]["name"], errors)
    if resource is PODS and _pod_spec_without_mutable(old.get("spec")) != _pod_spec_without_mutable(new.get("spec")):
        raise invalid("Pod", "", new["metadata"]["name"], "spec",
                      "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, "
                      "`spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only "
                      "additions to existing tolerations) or `spec.terminationGracePeriodSeconds`; to place a pod "
                      "on a node, create a Binding")


def check_deletable(resource: Resource, name: str) -> None:
    if resource is NAMESPACES and name in PROTECTED_NAMESPACES:
        raise forbidden(f'namespaces "{name}" is forbidden: this namespace may not be deleted')


def discovery(resources: tuple[Resource, ...]) -> list[Obj]:
    """The ``resources`` list of an APIResourceList, subresources included."""
    out: list[Obj] = []
    for r in resources:
        entry: Obj = {"name": r.plural, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind,
                      "verbs": list(ALL_VERBS if r.namespaced or r is NODES else
                                    [v for v in ALL_VERBS if v != "deletecollection"])}
        if r.short_names:
            entry["shortNames"] = list(r.short_names)
        if r is PODS:
            entry["categories"] = ["all"]
        out.append(entry)
        for sub in r.subresources:
            if sub == "binding":
                out.append({"name": f"{r.plural}/binding", "singularName": "", "namespaced": True,
                            "kind": "Binding", "verbs": ["create"]})
            else:
                out.append({"name": f"{r.plural}/{sub}", "singularName": "", "namespaced": r.namespaced,
                            "kind": r.kind, "verbs": list(SUBRESOURCE_VERBS)})
    return out


def core_discovery() -> list[Obj]:
    core = tuple(r for r in RESOURCES if not r.group)
    binding: Obj = {"name": "bindings", "singularName": "binding", "namespaced": True, "kind": "Binding",
                    "verbs": ["create"]}
    return [binding, *discovery(core)]


def check_kind(resource: Resource, body: Obj) -> None:
    """A body that names another kind or API version is a client mistake, not something to coerce."""
    kind = body.get("kind")
    version = body.get("apiVersion")
    if (kind and kind != resource.kind) or (version and version != resource.api_version):
        raise ApiError(400, "BadRequest",
                       f"the body is a {kind or '?'} ({version or '?'}), but this URL takes {resource.kind} "
                       f"({resource.api_version})")
