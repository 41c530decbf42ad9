"""Kubernetes Events on pods, so users see in ``kubectl describe pod`` why scheduling or binding failed."""

from __future__ import annotations

import datetime
import logging
from typing import Any

from kubernetes import client

log = logging.getLogger(__name__)


def record_pod_event(core_api: Any, namespace: str, name: str, uid: str, reason: str, message: str,
                     component: str, event_type: str = "Warning") -> None:
    """Create an Event on the pod; failures are logged and swallowed (an Event is never worth a crash)."""
    now = datetime.datetime.now(datetime.UTC)
    body = client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name=f"{name}.", namespace=namespace),
        involved_object=client.V1ObjectReference(api_version="v1", kind="Pod", namespace=namespace, name=name,
                                                 uid=uid or None),
        reason=reason, message=message, type=event_type, count=1, first_timestamp=now, last_timestamp=now,
        source=client.V1EventSource(component=component))
    try:
        core_api.create_namespaced_event(namespace, body, _preload_content=False)
    except Exception as exc:  # recording an Event is best effort
        log.warning("could not record an Event on pod %s/%s: %s", namespace, name, exc,
                    extra={"pod": f"{namespace}/{name}", "reason": reason})
