"""API errors as the Kubernetes API server reports them: an HTTP code and a ``v1.Status`` body.

Messages and reasons follow the real server's wording, because clients (kubectl, client libraries, our own
extender) match on ``reason`` and show ``message`` to people.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A request the API refuses; ``status()`` is the body sent back."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None,
                 metadata: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.metadata = metadata or {}

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": self.metadata, "status": "Failure",
                                "message": self.message, "reason": self.reason, "code": self.code}
        if self.details is not None:
            body["details"] = self.details
        return body


def _details(resource: str, group: str, name: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "kind": resource}
    if group:
        details["group"] = group
    return details


def qualified(resource: str, group: str) -> str:
    """``pods`` or ``leases.coordination.k8s.io``, the way messages name a resource."""
    return f"{resource}.{group}" if group else resource


def not_found(resource: str, group: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{qualified(resource, group)} "{name}" not found',
                    _details(resource, group, name))


def already_exists(resource: str, group: str, name: str) -> ApiError:
    return ApiError(409, "AlreadyExists", f'{qualified(resource, group)} "{name}" already exists',
                    _details(resource, group, name))


def conflict(resource: str, group: str, name: str, why: str) -> ApiError:
    return ApiError(409, "Conflict", f'Operation cannot be fulfilled on {qualified(resource, group)} "{name}": {why}',
                    _details(resource, group, name))


STALE = "the object has been modified; please apply your changes to the latest version and try again"


def invalid(kind: str, group: str, name: str, field: str, detail: str) -> ApiError:
    """422 Invalid for one bad field, e.g. ``Pod "x" is invalid: spec.containers: Required value``."""
    details = {"name": name, "kind": kind,
               "causes": [{"reason": "FieldValueInvalid", "message": detail, "field": field}]}
    if group:
        details["group"] = group
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {field}: {detail}', details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def expired(message: str, metadata: dict[str, Any] | None = None) -> ApiError:
    return ApiError(410, "Expired", message, metadata=metadata)


def too_large_resource_version(wanted: int, current: int) -> ApiError:
    """What the watch cache answers when a requested version has not arrived within its 3 s wait."""
    return ApiError(504, "Timeout", f"Timeout: Too large resource version: {wanted}, current: {current}",
                    {"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                     "retryAfterSeconds": 1})


def forbidden(message: str) -> ApiError:
    return ApiError(403, "Forbidden", message)


def method_not_allowed() -> ApiError:
    return ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")


def unprocessable(message: str) -> ApiError:
    return ApiError(422, "Invalid", message)


def not_acceptable(accept: str) -> ApiError:
    return ApiError(406, "NotAcceptable",
                    f"only the following media types are accepted: application/json (the client asked for {accept})")
