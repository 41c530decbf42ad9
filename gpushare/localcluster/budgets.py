"""PodDisruptionBudgets (policy/v1): decoding and validation as the real API server does them.

The local cluster runs no controllers, so nothing computes a budget's status: a test or the demo that wants
kube-scheduler to see ``disruptionsAllowed`` writes it through the status subresource, as kube-controller-
manager's disruption controller would.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from gpushare.localcluster import validation

Obj = dict[str, Any]

_PERCENT = re.compile(r"[0-9]+%")
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
_EMPTY_STATUS = {"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0}


def decode_budget(obj: Obj) -> None:
    spec = obj.get("spec")
    if spec is None:
        return
    if not isinstance(spec, dict):
        raise validation.DecodeError("json: cannot unmarshal into Go struct field PodDisruptionBudget.spec of type "
                                     "v1.PodDisruptionBudgetSpec", "spec")
    for key in ("minAvailable", "maxUnavailable"):
        value = spec.get(key)
        if value is not None and type(value) is not int and not isinstance(value, str):
            raise validation.DecodeError(f"json: cannot unmarshal into Go struct field PodDisruptionBudgetSpec.{key} "
                                         "of type intstr.IntOrString", f"spec.{key}")
    status = obj.get("status")
    if status is not None and not isinstance(status, dict):
        raise validation.DecodeError("json: cannot unmarshal into Go struct field PodDisruptionBudget.status of "
                                     "type v1.PodDisruptionBudgetStatus", "status")


def prepare_budget(obj: Obj) -> None:
    """A new budget starts with an empty status (the registry strategy's PrepareForCreate)."""
    obj["status"] = dict(_EMPTY_STATUS)
    obj["metadata"]["generation"] = 1


def validate_budget(obj: Obj) -> Iterator[validation.FieldError]:
    spec = obj.get("spec") or {}
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        yield validation.invalid_value("spec", "", "minAvailable and maxUnavailable cannot be both set")
    for key in ("minAvailable", "maxUnavailable"):
        if spec.get(key) is not None:
            yield from _int_or_percent(spec[key], f"spec.{key}")
    yield from _selector(spec.get("selector"), "spec.selector")
    status = obj.get("status") or {}
    for key in _EMPTY_STATUS:
        value = status.get(key, 0)
        if type(value) is not int or value < 0:
            yield validation.invalid_value(f"status.{key}", str(value), "must be greater than or equal to 0")


def _int_or_percent(value: int | str, path: str) -> Iterable[validation.FieldError]:
    if isinstance(value, int):
        if value < 0:
            yield validation.invalid_value(path, str(value), "must be greater than or equal to 0")
        return
    if not _PERCENT.fullmatch(value):
        yield validation.invalid_value(path, value, "a valid percent string must be a numeric string followed by "
                                       "an ending '%'")
    elif int(value[:-1]) > 100:
        yield validation.invalid_value(path, value, "must not be greater than 100%")


def _selector(selector: Any, path: str) -> Iterable[validation.FieldError]:
    if selector is None:
        return
    if not isinstance(selector, dict):
        yield validation.invalid_value(path, str(selector)[:60], "must be a label selector")
        return
    for key, value in (selector.get("matchLabels") or {}).items():
        for msg in validation.qualified_name_errors(str(key)):
            yield validation.invalid_value(f"{path}.matchLabels", str(key), msg)
        if not isinstance(value, str):
            yield validation.invalid_value(f"{path}.matchLabels", str(value), "must be a string")
    for i, entry in enumerate(selector.get("matchExpressions") or []):
        where = f"{path}.matchExpressions[{i}]"
        operator = entry.get("operator") if isinstance(entry, dict) else None
        values = (entry.get("values") or []) if isinstance(entry, dict) else []
        if operator not in _OPERATORS:
            yield validation.invalid_value(f"{where}.operator", str(operator), "not a valid selector operator")
        elif operator in ("In", "NotIn") and not values:
            yield validation.required(f"{where}.values", "must be specified when `operator` is 'In' or 'NotIn'")
        elif operator in ("Exists", "DoesNotExist") and values:
            yield validation.forbidden(f"{where}.values",
                                       "may not be specified when `operator` is 'Exists' or 'DoesNotExist'")
        for msg in validation.qualified_name_errors(str(entry.get("key", "") if isinstance(entry, dict) else "")):
            yield validation.invalid_value(f"{where}.key", str(entry.get("key") if isinstance(entry, dict) else ""),
                                           msg)
