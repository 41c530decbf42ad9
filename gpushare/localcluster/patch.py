"""The three PATCH bodies the API accepts: JSON merge patch, strategic merge patch, and JSON patch.

Stored objects are never changed in place: the merges return new dictionaries along the changed paths and
share untouched subtrees with the original, which keeps a patch of one annotation on a large pod cheap.

Strategic merge patch, the subset served here: it is a merge patch, except that the lists Kubernetes declares
with a merge key (containers and env by ``name``, conditions and addresses by ``type``, ...) are merged item
by item on that key, and a list item ``{"$patch": "delete", <key>: ...}`` removes the matching item. A map
``{"$patch": "replace", ...}`` replaces instead of merging. Other directives (``$setElementOrder/...``,
``$retainKeys``, ``$deleteFromPrimitiveList/...``) are ignored.
"""

from __future__ import annotations

from typing import Any

import jsonpatch
import jsonpointer

from gpushare.kube.api import MERGE_PATCH
from gpushare.localcluster.errors import ApiError, bad_request, unprocessable

STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
PATCH_TYPES = (JSON_PATCH, MERGE_PATCH, STRATEGIC_MERGE_PATCH)

# The patchMergeKey of the list fields of the kinds served here (from the Kubernetes API types).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "conditions": "type",
    "addresses": "type",
    "taints": "key",
    "ownerReferences": "uid",
    "resourceClaims": "name",
}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge recursively, ``null`` removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _without_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_without_directives(v) for v in value]
    return value


def _merge_list(target: list[Any], patch: list[Any], key: str) -> list[Any]:
    result = list(target)
    for item in patch:
        position = next((i for i, old in enumerate(result) if isinstance(old, dict) and old.get(key) == item[key]),
                        None)
        if item.get("$patch") == "delete":
            if position is not None:
                del result[position]
        elif position is None:
            result.append(_without_directives(item))
        else:
            result[position] = strategic_merge_patch(result[position], item)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return _without_directives(patch)
    if patch.get("$patch") == "replace":
        return _without_directives(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        old = result.get(key)
        merge_key = MERGE_KEYS.get(key)
        if value is None or (isinstance(value, dict) and value.get("$patch") == "delete"):
            result.pop(key, None)
        elif isinstance(value, dict):
            result[key] = strategic_merge_patch(old, value)
        elif (merge_key and isinstance(value, list) and isinstance(old, list)
              and all(isinstance(item, dict) and merge_key in item for item in value)):
            result[key] = _merge_list(old, value, merge_key)
        else:
            result[key] = _without_directives(value)
    return result


def json_patch(target: dict[str, Any], operations: Any) -> Any:
    """RFC 6902. A malformed patch is a 400; one that does not apply to this object is a 422."""
    if not isinstance(operations, list):
        raise bad_request("a JSON patch (application/json-patch+json) must be a JSON list of operations such as "
                          '[{"op": "replace", "path": "/metadata/labels/app", "value": "web"}]')
    try:
        return jsonpatch.apply_patch(target, operations)
    except jsonpatch.InvalidJsonPatch as exc:
        raise bad_request(f"the JSON patch is malformed: {exc}") from None
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
        raise unprocessable(f"the JSON patch does not apply to the object: {exc}") from None


def apply_patch(patch_type: str, target: dict[str, Any], patch: Any) -> dict[str, Any]:
    if patch_type == JSON_PATCH:
        result = json_patch(target, patch)
    elif not isinstance(patch, dict):
        raise bad_request(f"a {patch_type} patch must be a JSON object, not {type(patch).__name__}")
    elif patch_type == MERGE_PATCH:
        result = merge_patch(target, patch)
    else:
        result = strategic_merge_patch(target, patch)
    if not isinstance(result, dict):
        raise unprocessable("the patch replaces the whole object with something that is not a JSON object")
    return result


def check_patch_type(content_type: str) -> str:
    """The patch type named by a Content-Type header; 415 for anything else (server-side apply included)."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media in PATCH_TYPES:
        return media
    raise ApiError(415, "UnsupportedMediaType",
                   f"the body of the request was in an unknown format ({media or 'no Content-Type'}) - accepted media "
                   f"types include: {', '.join(PATCH_TYPES)} (server-side apply is not supported by the local "
                   "cluster)")
