"""Every call gpushare makes to the Kubernetes API, typed, with one error hierarchy.

The official client's hints describe model objects, not the raw replies read here, and it raises
``ApiException`` for answers and urllib3 or OS errors for everything else; all of that stops here. Callers
see ``Pods``, ``Nodes``, ``Leases``, ``DisruptionBudgets`` and ``PodGroups``, JSON dicts, and ``KubeError``
subclasses whose text is a sentence saying what happened and what to do. Replies are read raw
(``_preload_content=False``): at thousands of pods, building the client's model objects costs more than the
rest of the work. Every call carries a timeout, overridable so that a caller with a deadline can pass what is
left of it; together with the loader's ``retries = False`` nothing waits longer than its caller allows.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

import orjson
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
DEFAULT_TIMEOUT_S = 10.0

Obj = dict[str, Any]
"""A Kubernetes object as the API server's JSON."""


class ListCall(Protocol):
    """A generated list call of the client (``CoreV1Api.list_node`` and kin), which also opens watches."""

    def __call__(self, *, _preload_content: bool, watch: bool = ..., resource_version: str = ...,
                 allow_watch_bookmarks: bool = ..., timeout_seconds: int = ..., limit: int = ...,
                 _continue: str = ..., field_selector: str | None = ...,
                 label_selector: str | None = ...) -> urllib3.BaseHTTPResponse: ...


def _list_call(method: Callable[..., object]) -> ListCall:
    # The generated hints promise model objects; with ``_preload_content=False`` the reply is urllib3's.
    return cast(ListCall, method)


class KubeError(Exception):
    """A request to the API server failed; the text says what happened and what to do."""

    def __init__(self, sentence: str, status: int | None = None, api_message: str = "") -> None:
        super().__init__(sentence)
        self.status = status
        self.api_message = api_message


class NotFound(KubeError):
    """404: the object does not exist (any more)."""


class Conflict(KubeError):
    """409: someone else changed or created the object first (a failed resourceVersion precondition)."""


class Forbidden(KubeError):
    """401 or 403: the credentials in use were not accepted, or may not do this."""


class Invalid(KubeError):
    """400 or 422: the API server rejected the request itself; its message says why."""


class Unavailable(KubeError):
    """No answer in time, no connection, or a 429/5xx: the API server may answer a later try."""


@dataclass(frozen=True, slots=True)
class _Action:
    """A request in the words an operator needs: what it does, and the RBAC verb and resource it takes."""

    what: str
    verb: str
    resource: str


def _api_message(exc: ApiException) -> str:
    """The API server's own explanation from a Status body, else its status line."""
    try:
        message = orjson.loads(exc.body or b"{}").get("message")
    except (orjson.JSONDecodeError, AttributeError, TypeError):
        message = None
    # Without its final period, so that it reads inside our sentences.
    return str(message or f"HTTP {exc.status} {exc.reason}").rstrip(".")


def _answer_error(exc: ApiException, action: _Action, host: str) -> KubeError:
    status = int(exc.status or 0)
    message = _api_message(exc)
    line = f"{status} {exc.reason}"
    if status == 404:
        return NotFound(f"Could not {action.what}: the API server at {host} answered {line} ({message}).",
                        status, message)
    if status == 409:
        return Conflict(f"Could not {action.what}: the API server at {host} answered {line} ({message}); "
                        "someone else changed it first.", status, message)
    if status == 401:
        return Forbidden(f"The API server at {host} did not accept the credentials in use when asked to "
                         f"{action.what} ({line}: {message}); check the kubeconfig user's token or certificate, or "
                         "the pod's service account token.", status, message)
    if status == 403:
        return Forbidden(f"The API server at {host} refused to {action.what} ({line}: {message}); grant the "
                         f"credentials in use (the kubeconfig user, or the pod's service account) the RBAC verb "
                         f"'{action.verb}' on '{action.resource}'.", status, message)
    if status in (400, 422):
        return Invalid(f"The API server at {host} rejected the request to {action.what} ({line}): {message}.",
                       status, message)
    if status == 429 or status >= 500:
        return Unavailable(f"The API server at {host} could not {action.what} ({line}: {message}); it may be "
                           "overloaded or restarting, so try again shortly.", status, message)
    return KubeError(f"The API server at {host} answered {line} when asked to {action.what}: {message}.",
                     status, message)


def _transport_error(exc: Exception, action: _Action, host: str, timeout_s: float) -> KubeError:
    cause = exc.reason if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason else exc
    # urllib3's NewConnectionError (refused, unresolvable) subclasses its TimeoutError: a refusal is no timeout.
    timed_out = (isinstance(cause, urllib3.exceptions.TimeoutError | TimeoutError)
                 and not isinstance(cause, urllib3.exceptions.NewConnectionError))
    if timed_out:
        return Unavailable(f"The API server at {host} did not answer within {timeout_s:g} s when asked to "
                           f"{action.what}; check that the cluster is running and not overloaded.")
    # urllib3 prefixes the cause with the connection's repr; the host is already in the sentence.
    reason = str(getattr(cause, "reason", None) or cause).rsplit("): ", 1)[-1]
    return Unavailable(f"Cannot reach the Kubernetes API server at {host} to {action.what} ({reason}); check the "
                       "kubeconfig context and that the cluster is running.")


class _Resource:
    """The shared request path: raw reply, timeout, and the translation of every failure into a ``KubeError``."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.host = str(api_client.configuration.host)

    def _send(self, action: _Action, method: Callable[..., Any], *args: object, timeout_s: float,
              **kwargs: object) -> bytes:
        if timeout_s <= 0:  # a caller whose deadline has passed; the client would refuse a timeout of 0
            raise Unavailable(f"There was no time left to {action.what} at the API server at {self.host}; the "
                              "caller's deadline had passed.")
        try:
            response = cast(urllib3.BaseHTTPResponse,
                            method(*args, _preload_content=False, _request_timeout=timeout_s, **kwargs))
            return response.data
        except ApiException as exc:
            raise _answer_error(exc, action, self.host) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _transport_error(exc, action, self.host, timeout_s) from None

    def _json(self, action: _Action, method: Callable[..., Any], *args: object, timeout_s: float,
              **kwargs: object) -> Obj:
        data = self._send(action, method, *args, timeout_s=timeout_s, **kwargs)
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict):
            raise KubeError(f"The server at {self.host} answered the request to {action.what} with something other "
                            "than Kubernetes JSON; check the server URL.")
        return obj


class Pods(_Resource):
    """Pods: read, list, annotate with a resourceVersion precondition, bind, and Events about them."""

    def __init__(self, api_client: client.ApiClient) -> None:
        super().__init__(api_client)
        self._core = client.CoreV1Api(api_client)
        self.list_call = _list_call(self._core.list_pod_for_all_namespaces)

    def read(self, namespace: str, name: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Obj:
        return self._json(_Action(f"read pod {namespace}/{name}", "get", "pods"),
                          self._core.read_namespaced_pod, name, namespace, timeout_s=timeout_s)

    def list(self, *, field_selector: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Obj]:
        """The pods of all namespaces (those matching ``field_selector``, if given)."""
        where = f" with {field_selector}" if field_selector else ""
        selectors = {"field_selector": field_selector} if field_selector else {}
        body = self._json(_Action(f"list the pods{where}", "list", "pods"),
                          self._core.list_pod_for_all_namespaces, timeout_s=timeout_s, **selectors)
        return list(body.get("items") or [])

    def annotate(self, namespace: str, name: str, resource_version: str | None,
                 annotations: Mapping[str, str | None], *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Obj:
        """Merge ``annotations`` into the pod (``None`` removes a key); the pod as written comes back.

        With a ``resource_version`` the write happens only if the pod is still at that version, else ``Conflict``;
        with ``None`` it happens unconditionally.
        """
        metadata: Obj = {"annotations": dict(annotations)}
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        return self._json(_Action(f"write the annotations of pod {namespace}/{name}", "patch", "pods"),
                          self._core.patch_namespaced_pod, name, namespace, {"metadata": metadata},
                          _content_type=MERGE_PATCH, timeout_s=timeout_s)

    def bind(self, namespace: str, name: str, uid: str, node: str, *, annotations: Mapping[str, str] | None = None,
             resource_version: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Create the pod's Binding to ``node``, in one write: the pod gets its node and ``annotations`` together.

        The API server merges a Binding's annotations into the pod and checks its metadata as preconditions: with
        a ``uid`` only that incarnation of the pod is bound, with a ``resource_version`` only the pod as it was
        then (else ``Conflict``, as for a pod bound already).
        """
        # The Binding as its JSON, not as the client's model objects: building and serialising those cost the bind's
        # thread about 0.07 ms of CPU a pod, on every GPU pod (docs/throughput-history.md, round 60).
        metadata: Obj = {"name": name, "namespace": namespace}
        if uid:
            metadata["uid"] = uid
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        if annotations:
            metadata["annotations"] = dict(annotations)
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": metadata,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        # Raw reply: the client's model for Binding fails to deserialize some servers' answers.
        self._send(_Action(f"bind pod {namespace}/{name} to node {node}", "create", "bindings"),
                   self._core.create_namespaced_binding, namespace, body, timeout_s=timeout_s)

    def record_event(self, namespace: str, name: str, uid: str, *, reason: str, message: str, component: str,
                     event_type: str = "Warning", timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Create an Event on the pod, for ``kubectl describe pod``; a failure is logged, never raised."""
        now = datetime.datetime.now(datetime.UTC)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{name}.", namespace=namespace),
            involved_object=client.V1ObjectReference(api_version="v1", kind="Pod", namespace=namespace, name=name,
                                                     uid=uid or None),
            reason=reason, message=message, type=event_type, count=1, first_timestamp=now, last_timestamp=now,
            source=client.V1EventSource(component=component))
        try:
            self._send(_Action(f"record an Event on pod {namespace}/{name}", "create", "events"),
                       self._core.create_namespaced_event, namespace, body, timeout_s=timeout_s)
        except KubeError as exc:  # an Event explains; it is never worth failing the work it explains
            log.warning("%s", exc, extra={"pod": f"{namespace}/{name}", "reason": reason})


class Nodes(_Resource):
    """Nodes: read, list, and the device plugin's writes of its GPU inventory."""

    def __init__(self, api_client: client.ApiClient) -> None:
        super().__init__(api_client)
        self._core = client.CoreV1Api(api_client)
        self.list_call = _list_call(self._core.list_node)

    def read(self, name: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Obj:
        return self._json(_Action(f"read node {name}", "get", "nodes"), self._core.read_node, name,
                          timeout_s=timeout_s)

    def list(self, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Obj]:
        body = self._json(_Action("list the nodes", "list", "nodes"), self._core.list_node, timeout_s=timeout_s)
        return list(body.get("items") or [])

    def annotate(self, name: str, annotations: Mapping[str, str | None], *,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> Obj:
        """Merge ``annotations`` into the node (``None`` removes a key)."""
        return self._json(_Action(f"write the annotations of node {name}", "patch", "nodes"),
                          self._core.patch_node, name, {"metadata": {"annotations": dict(annotations)}},
                          _content_type=MERGE_PATCH, timeout_s=timeout_s)

    def patch_status(self, name: str, status: Obj, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Obj:
        """Merge ``status`` into the node's status (capacity and allocatable of extended resources)."""
        return self._json(_Action(f"update the status of node {name}", "patch", "nodes/status"),
                          self._core.patch_node_status, name, {"status": status}, _content_type=MERGE_PATCH,
                          timeout_s=timeout_s)


class Leases(_Resource):
    """``coordination.k8s.io/v1`` Leases, for leader election; writes carry the resourceVersion they replace."""

    def __init__(self, api_client: client.ApiClient) -> None:
        super().__init__(api_client)
        self._coordination = client.CoordinationV1Api(api_client)

    def read(self, namespace: str, name: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Obj:
        return self._json(_Action(f"read lease {namespace}/{name}", "get", "leases"),
                          self._coordination.read_namespaced_lease, name, namespace, timeout_s=timeout_s)

    def create(self, namespace: str, body: Obj, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Obj:
        name = body.get("metadata", {}).get("name")
        return self._json(_Action(f"create lease {namespace}/{name}", "create", "leases"),
                          self._coordination.create_namespaced_lease, namespace, body, timeout_s=timeout_s)

    def replace(self, namespace: str, name: str, body: Obj, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Obj:
        """Write the whole Lease; ``Conflict`` if it changed since the resourceVersion in ``body``."""
        return self._json(_Action(f"update lease {namespace}/{name}", "update", "leases"),
                          self._coordination.replace_namespaced_lease, name, namespace, body, timeout_s=timeout_s)


class DisruptionBudgets(_Resource):
    """PodDisruptionBudgets (policy/v1): listed and watched, for preemption's count of violations."""

    def __init__(self, api_client: client.ApiClient) -> None:
        super().__init__(api_client)
        self.list_call = _list_call(client.PolicyV1Api(api_client).list_pod_disruption_budget_for_all_namespaces)


class PodGroups(_Resource):
    """scheduler-plugins' coscheduling PodGroups (``scheduling.x-k8s.io/v1alpha1``), a CRD a cluster may not have."""

    GROUP = "scheduling.x-k8s.io"
    VERSION = "v1alpha1"
    PLURAL = "podgroups"

    def __init__(self, api_client: client.ApiClient) -> None:
        super().__init__(api_client)
        self._custom = client.CustomObjectsApi(api_client)

    def read(self, namespace: str, name: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Obj:
        """The PodGroup; ``NotFound`` when it does not exist, or when the cluster has no PodGroup CRD at all."""
        return self._json(_Action(f"read PodGroup {namespace}/{name}", "get", self.PLURAL),
                          self._custom.get_namespaced_custom_object, self.GROUP, self.VERSION, namespace, self.PLURAL,
                          name, timeout_s=timeout_s)


@dataclass(frozen=True)
class Kube:
    """One API server as gpushare uses it. Tests swap a part (``dataclasses.replace``) to stage races."""

    pods: Pods
    nodes: Nodes
    leases: Leases
    budgets: DisruptionBudgets
    pod_groups: PodGroups

    @classmethod
    def from_api_client(cls, api_client: client.ApiClient) -> Kube:
        return cls(Pods(api_client), Nodes(api_client), Leases(api_client), DisruptionBudgets(api_client),
                   PodGroups(api_client))

    @property
    def host(self) -> str:
        return self.pods.host
