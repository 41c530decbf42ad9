"""Decoding and validation of pods and nodes as the API server does them, with its field paths and messages.

The API server handles a write in two steps, and the local cluster keeps both because clients see the
difference:

1. *Decoding* the JSON into Go types. A value of the wrong JSON type, or a quantity that does not parse,
   fails here with 400 ``BadRequest`` (``Pod in version "v1" cannot be handled as a Pod: ...``). Decoding
   also rewrites every quantity in its canonical form (``"1000m"`` is stored as ``"1"``).
2. *Validation* of the decoded object, which collects every problem and answers 422 ``Invalid`` with one
   cause per field (``Pod "x" is invalid: spec.containers[0].resources.limits[aliyun.com/gpu-mem]:
   Invalid value: "500m": must be an integer``).

The rules are those of ``pkg/apis/core/validation`` and ``apimachinery/pkg/api/validation`` for the fields
gpushare and its tools use: object metadata (names, labels, annotations), containers (names, images,
resources) and node resources.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpushare.localcluster.errors import ApiError
from gpushare.quantity import QuantityError, quantity

Obj = dict[str, Any]

TOTAL_ANNOTATION_SIZE_LIMIT_B = 256 * 1024
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

QUALIFIED_NAME_MSG = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
                      "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
                      "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")
LABEL_VALUE_MSG = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
                   "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or "
                   "'12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")
DNS_LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
                 "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
                 "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
DNS_SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                     "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
                     r"validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")

# Container resources without a domain that the API server knows (IsStandardContainerResourceName).
_STANDARD_CONTAINER_RESOURCES = ("cpu", "memory", "ephemeral-storage")
# Resources that may only be whole numbers besides the extended ones (IsIntegerResourceName).
_INTEGER_RESOURCES = ("pods", "services", "replicationcontrollers", "resourcequotas", "secrets", "configmaps",
                      "persistentvolumeclaims", "services.nodeports", "services.loadbalancers")
# Resource names without a domain that are valid at all (IsStandardResourceName): the container ones, quota
# names and the node-level ones.
_STANDARD_RESOURCES = (*_STANDARD_CONTAINER_RESOURCES, *_INTEGER_RESOURCES, "storage", "requests.cpu",
                       "requests.memory", "requests.storage", "requests.ephemeral-storage", "limits.cpu",
                       "limits.memory", "limits.ephemeral-storage", "count")

_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "bool", int: "number", float: "number"}


@dataclass(frozen=True)
class FieldError:
    """One problem with one field, worded as ``k8s.io/apimachinery/pkg/util/validation/field`` words it."""

    reason: str  # the StatusCause reason, e.g. FieldValueInvalid
    label: str  # how the message names the problem, e.g. "Invalid value"
    field: str
    detail: str
    value: str | None = None  # the bad value, quoted in the message

    def body(self) -> str:
        head = self.label if self.value is None else f'{self.label}: "{self.value}"'
        return f"{head}: {self.detail}" if self.detail else head

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"


def invalid_value(path: str, value: str, detail: str) -> FieldError:
    return FieldError("FieldValueInvalid", "Invalid value", path, detail, value)


def required(path: str, detail: str = "") -> FieldError:
    return FieldError("FieldValueRequired", "Required value", path, detail)


def duplicate(path: str, value: str) -> FieldError:
    return FieldError("FieldValueDuplicate", "Duplicate value", path, "", value)


def forbidden(path: str, detail: str) -> FieldError:
    return FieldError("FieldValueForbidden", "Forbidden", path, detail)


def not_supported(path: str, value: str, supported: tuple[str, ...]) -> FieldError:
    return FieldError("FieldValueNotSupported", "Unsupported value", path,
                      "supported values: " + ", ".join(f'"{v}"' for v in supported), value)


def too_long(path: str, limit: int) -> FieldError:
    return FieldError("FieldValueTooLong", "Too long", path, f"may not be more than {limit} bytes")


def invalid_object(kind: str, group: str, name: str, errors: list[FieldError]) -> ApiError:
    """422 Invalid listing every problem, as ``errors.NewInvalid`` does: one cause per field."""
    summary = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(map(str, errors)) + "]"
    details: Obj = {"name": name, "kind": kind,
                    "causes": [{"reason": e.reason, "message": e.body(), "field": e.field} for e in errors]}
    if group:
        details["group"] = group
    qualified = f"{kind}.{group}" if group else kind
    return ApiError(422, "Invalid", f'{qualified} "{name}" is invalid: {summary}', details)


# -- decoding ----------------------------------------------------------------------------------------------------


class DecodeError(Exception):
    """The body cannot become the Go type: the text of the decoder's error, and the field it stopped at."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


def decode_error(kind: str, version: str, error: DecodeError) -> ApiError:
    """400 BadRequest in the API server's ``transformDecodeError`` wording (the kind and version missing from a
    body are those of the URL). ``details.causes`` names the field: the real message does not, so the field
    is added where clients can read it without changing the message."""
    return ApiError(400, "BadRequest", f'{kind} in version "{version}" cannot be handled as a {kind}: {error.message}',
                    {"causes": [{"reason": "FieldValueInvalid", "message": error.message, "field": error.field}]})


def _type_error(value: Any, struct: str, path: str, go_type: str) -> DecodeError:
    json_type = _JSON_TYPES.get(type(value), "value")
    return DecodeError(f"json: cannot unmarshal {json_type} into Go struct field {struct}.{path} of type {go_type}",
                       path)


def _expect(value: Any, kind: type, struct: str, path: str, go_type: str) -> None:
    """None decodes to the zero value; anything else must have the JSON type the Go field has."""
    if value is not None and (not isinstance(value, kind) or (kind is not bool and isinstance(value, bool))):
        raise _type_error(value, struct, path, go_type)


def _decode_quantity(value: Any, path: str) -> str:
    """A quantity as the decoder reads it: a string or a bare JSON number; null is zero; the canonical form."""
    if value is None:
        return "0"
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        text = "true" if value is True else "false" if value is False else "{...}"
    else:
        text = value if isinstance(value, str) else str(value)
    try:
        return quantity(text).canonical
    except QuantityError as exc:
        reason = str(exc).partition(": ")[2]
        raise DecodeError(reason, path) from None


def _decode_resource_list(value: Any, struct: str, path: str) -> dict[str, str] | None:
    _expect(value, dict, struct, path, "v1.ResourceList")
    if value is None:
        return None
    return {str(name): _decode_quantity(q, f"{path}[{name}]") for name, q in value.items()}


def decode_string_map(parent: Obj, key: str, struct: str, path: str) -> None:
    value = parent.get(key)
    _expect(value, dict, struct, path, "map[string]string")
    for item in (value or {}).values():
        _expect(item, str, struct, path, "string")


def decode_metadata(meta: Obj) -> None:
    for key in ("labels", "annotations"):
        decode_string_map(meta, key, "ObjectMeta", f"metadata.{key}")


def _decode_container(container: Any, path: str) -> Obj:
    _expect(container, dict, "PodSpec", path.rsplit("[", 1)[0], "v1.Container")
    out = dict(container or {})
    for key in ("name", "image"):
        _expect(out.get(key), str, "Container", f"{path}.{key}", "string")
    resources = out.get("resources")
    _expect(resources, dict, "Container", f"{path}.resources", "v1.ResourceRequirements")
    if resources:
        resources = dict(resources)
        for key in ("limits", "requests"):
            if key in resources:
                resources[key] = _decode_resource_list(resources[key], "ResourceRequirements",
                                                       f"{path}.resources.{key}")
        out["resources"] = resources
    return out


def decode_pod(obj: Obj) -> None:
    """Type-check the fields that validation reads and canonicalise container quantities, in place."""
    spec = obj.get("spec")
    _expect(spec, dict, "Pod", "spec", "v1.PodSpec")
    if spec is None:
        return
    spec = dict(spec)
    for key in ("containers", "initContainers"):
        containers = spec.get(key)
        _expect(containers, list, "PodSpec", f"spec.{key}", "[]v1.Container")
        if containers is not None:
            spec[key] = [_decode_container(c, f"spec.{key}[{i}]") for i, c in enumerate(containers)]
    obj["spec"] = spec


def decode_node(obj: Obj) -> None:
    """Canonicalise a node's capacity and allocatable, in place."""
    status = obj.get("status")
    _expect(status, dict, "Node", "status", "v1.NodeStatus")
    if not status:
        return
    status = dict(status)
    for key in ("capacity", "allocatable"):
        if key in status:
            status[key] = _decode_resource_list(status[key], "NodeStatus", f"status.{key}")
    obj["status"] = status


# -- names -------------------------------------------------------------------------------------------------------


def dns_subdomain_errors(value: str) -> list[str]:
    out = ["must be no more than 253 characters"] if len(value) > 253 else []
    if not _DNS_SUBDOMAIN.fullmatch(value):
        out.append(DNS_SUBDOMAIN_MSG)
    return out


def dns_label_errors(value: str) -> list[str]:
    out = ["must be no more than 63 characters"] if len(value) > 63 else []
    if not _DNS_LABEL.fullmatch(value):
        out.append(DNS_LABEL_MSG)
    return out


def qualified_name_errors(value: str) -> list[str]:
    """``IsQualifiedName``: an optional DNS subdomain prefix and ``/``, then a name of at most 63 characters."""
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
        prefix_errors: list[str] = []
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            prefix_errors = ["prefix part must be non-empty"]
        else:
            prefix_errors = [f"prefix part {msg}" for msg in dns_subdomain_errors(prefix)]
    else:
        return ["a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
                "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
                "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix "
                "and '/' (e.g. 'example.com/MyName')"]
    if not name:
        return [*prefix_errors, "name part must be non-empty"]
    out = list(prefix_errors)
    if len(name) > 63:
        out.append("name part must be no more than 63 characters")
    if not _QUALIFIED_NAME.fullmatch(name):
        out.append(QUALIFIED_NAME_MSG)
    return out


def validate_metadata(meta: Obj) -> Iterator[FieldError]:
    """Labels and annotations, as ``ValidateObjectMeta`` checks them (names are checked on create)."""
    for key, value in (meta.get("labels") or {}).items():
        for msg in qualified_name_errors(key):
            yield invalid_value("metadata.labels", key, msg)
        if len(value) > 63:
            yield invalid_value("metadata.labels", value, "must be no more than 63 characters")
        if not _LABEL_VALUE.fullmatch(value):
            yield invalid_value("metadata.labels", value, LABEL_VALUE_MSG)
    annotations = meta.get("annotations") or {}
    for key in annotations:
        for msg in qualified_name_errors(key.lower()):
            yield invalid_value("metadata.annotations", key, msg)
    if sum(len(k) + len(v) for k, v in annotations.items()) > TOTAL_ANNOTATION_SIZE_LIMIT_B:
        yield too_long("metadata.annotations", TOTAL_ANNOTATION_SIZE_LIMIT_B)


# -- resources ---------------------------------------------------------------------------------------------------


def is_native_resource(name: str) -> bool:
    return "/" not in name or "kubernetes.io/" in name


def is_hugepages(name: str) -> bool:
    return name.startswith("hugepages-")


def is_extended_resource(name: str) -> bool:
    """A name with a domain other than kubernetes.io, valid as a quota name once prefixed with ``requests.``."""
    if is_native_resource(name) or name.startswith("requests."):
        return False
    return not qualified_name_errors("requests." + name)


def overcommit_allowed(name: str) -> bool:
    return is_native_resource(name) and not is_hugepages(name)


def _resource_name_errors(name: str, path: str, container: bool) -> list[FieldError]:
    errors = [invalid_value(path, name, msg) for msg in qualified_name_errors(name)]
    if errors:
        return errors
    if "/" not in name:
        if not (name in _STANDARD_RESOURCES or is_hugepages(name)):
            return [invalid_value(path, name, "must be a standard resource type or fully qualified")]
        if container and not (name in _STANDARD_CONTAINER_RESOURCES or is_hugepages(name)):
            return [invalid_value(path, name, "must be a standard resource for containers")]
    elif container and not is_native_resource(name) and not is_extended_resource(name):
        return [invalid_value(path, name, "doesn't follow extended resource name standard")]
    return []


def _quantity_errors(name: str, value: str, path: str) -> list[FieldError]:
    amount = quantity(value).value
    errors = []
    if amount < 0:
        errors.append(invalid_value(path, value, "must be greater than or equal to 0"))
    if (name in _INTEGER_RESOURCES or is_extended_resource(name)) and amount % 1 != Decimal(0):
        errors.append(invalid_value(path, value, "must be an integer"))
    return errors


def validate_container_resources(resources: Obj, path: str) -> Iterator[FieldError]:
    """``ValidateContainerResourceRequirements``: names, non-negative (and whole, where required) quantities,
    requests no larger than limits, and equal to them for resources that cannot be overcommitted."""
    limits: dict[str, str] = resources.get("limits") or {}
    requests: dict[str, str] = resources.get("requests") or {}
    for name, value in limits.items():
        key_path = f"{path}.limits[{name}]"
        yield from _resource_name_errors(name, key_path, container=True)
        yield from _quantity_errors(name, value, key_path)
    for name, value in requests.items():
        key_path = f"{path}.requests[{name}]"
        yield from _resource_name_errors(name, key_path, container=True)
        yield from _quantity_errors(name, value, key_path)
        if name in limits:
            request, limit = quantity(value).value, quantity(limits[name]).value
            if request != limit and not overcommit_allowed(name):
                yield invalid_value(f"{path}.requests", value, f"must be equal to {name} limit of {limits[name]}")
            elif request > limit:
                yield invalid_value(f"{path}.requests", value,
                                    f"must be less than or equal to {name} limit of {limits[name]}")
        elif not overcommit_allowed(name):
            yield required(f"{path}.limits", "Limit must be set for non overcommitable resources")


def validate_pod_spec(spec: Any) -> Iterator[FieldError]:
    if not isinstance(spec, dict):
        spec = {}
    if not spec.get("containers"):
        yield required("spec.containers")
    seen: set[str] = set()
    for key in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(key) or []):
            path = f"spec.{key}[{i}]"
            name = container.get("name") or ""
            if not name:
                yield required(f"{path}.name")
            else:
                for msg in dns_label_errors(name):
                    yield invalid_value(f"{path}.name", name, msg)
                if name in seen:
                    yield duplicate(f"{path}.name", name)
                seen.add(name)
            if not container.get("image"):
                yield required(f"{path}.image")
            yield from validate_container_resources(container.get("resources") or {}, f"{path}.resources")


def validate_node_resources(status: Any) -> Iterator[FieldError]:
    """``ValidateNodeResources``: capacity and allocatable quantities, at paths like ``status.capacity.cpu``."""
    if not isinstance(status, dict):
        return
    for key in ("capacity", "allocatable"):
        for name, value in (status.get(key) or {}).items():
            path = f"status.{key}.{name}"
            yield from _resource_name_errors(name, path, container=False)
            yield from _quantity_errors(name, value, path)


_INT32_MAX = 2**31 - 1


def validate_podgroup_spec(spec: Any) -> Iterator[FieldError]:
    """The PodGroup CRD's OpenAPI schema (scheduler-plugins, ``scheduling.x-k8s.io/v1alpha1``) for the fields
    gpushare reads: ``minMember`` and ``scheduleTimeoutSeconds``, int32 integers, ``minMember`` at least 0."""
    if spec is None:
        return
    if not isinstance(spec, dict):
        yield invalid_value("spec", _JSON_TYPES.get(type(spec), "null"), 'spec in body must be of type object: '
                            f'"{_JSON_TYPES.get(type(spec), "null")}"')
        return
    for key, minimum in (("minMember", 0), ("scheduleTimeoutSeconds", None)):
        if key not in spec or spec[key] is None:
            continue
        value, path = spec[key], f"spec.{key}"
        if not isinstance(value, int) or isinstance(value, bool):
            kind = _JSON_TYPES.get(type(value), "null")
            yield invalid_value(path, kind, f'{path} in body must be of type integer: "{kind}"')
        elif minimum is not None and value < minimum:
            yield invalid_value(path, str(value), f"{path} in body should be greater than or equal to {minimum}")
        elif not -_INT32_MAX - 1 <= value <= _INT32_MAX:
            yield invalid_value(path, str(value), f"{path} in body must be of type int32")
