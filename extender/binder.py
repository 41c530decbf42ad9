"""bind: choose GPUs, hold them in the cache, record them on the pod, then bind the pod to its node.

Order matters. The reservation comes first so that concurrent binds never pick the same memory; the
annotations are written with the pod's resourceVersion as a precondition, so a pod changed since it was
read is re-read and re-decided rather than overwritten; the Binding comes last, so a pod never runs
without the annotations the device plugin needs. Any failure undoes what was done and comes back as a
sentence (kube-scheduler shows it in the pod's events; a non-200 status would show only "code 500").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from extender.placement import PolicyBook, RequestCache
from extender.wire import BindingArgs
from gpushare.cache.state import ClusterCache, Reservation, ReservationError
from gpushare.contract import PodInfo, PodRequest, RequestError, new_assignment
from gpushare.kube.convert import pod_info
from gpushare.kube.events import record_pod_event
from gpushare.model import Node

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
MAX_ATTEMPTS = 5
API_TIMEOUT_S = 10
COMPONENT = "gpushare-extender"


@dataclass(frozen=True, slots=True)
class BindOutcome:
    error: str = ""
    conflicts: int = 0
    gpus: tuple[int, ...] = ()


class _Conflict(Exception):
    """The pod changed between read and patch; read it again and decide again."""


class _Failed(Exception):
    """The bind cannot succeed; the text is the user's explanation."""


def api_message(exc: ApiException) -> str:
    """The API server's own explanation from an error response, else its status line."""
    try:
        message = orjson.loads(exc.body or b"{}").get("message")
    except (orjson.JSONDecodeError, AttributeError):
        message = None
    return str(message or f"HTTP {exc.status} {exc.reason}")


@dataclass(frozen=True)
class BindHooks:
    """Calls into a bind in progress, where tests stage the changes that race with it in a real cluster."""

    after_read: Callable[[PodInfo], None] | None = None
    before_binding: Callable[[PodInfo], None] | None = None


class Binder:
    def __init__(self, core_api: Any, cache: ClusterCache, book: PolicyBook, requests: RequestCache,
                 hooks: BindHooks | None = None) -> None:
        self._core = core_api
        self._cache = cache
        self._book = book
        self._requests = requests
        self._hooks = hooks or BindHooks()

    def bind(self, args: BindingArgs) -> BindOutcome:
        conflicts = 0
        for _ in range(MAX_ATTEMPTS):
            try:
                gpus = self._attempt(args)
            except _Conflict:
                conflicts += 1
                continue
            except Exception as exc:  # every failure becomes the answer's Error, never a 500
                if not isinstance(exc, _Failed | RequestError):
                    log.exception("unexpected failure while binding", extra={"node": args.node})
                message = f"gpushare could not bind pod {args.pod_namespace}/{args.pod_name} to node {args.node}: {exc}"
                log.warning(message, extra={"pod": f"{args.pod_namespace}/{args.pod_name}", "node": args.node})
                record_pod_event(self._core, args.pod_namespace, args.pod_name, args.pod_uid, "GPUShareBindFailed",
                                 message, COMPONENT)
                return BindOutcome(error=message, conflicts=conflicts)
            log.info("bound pod", extra={"pod": f"{args.pod_namespace}/{args.pod_name}", "node": args.node,
                                         "gpus": list(gpus), "conflicts": conflicts})
            return BindOutcome(conflicts=conflicts, gpus=gpus)
        message = (f"gpushare could not bind pod {args.pod_namespace}/{args.pod_name} to node {args.node}: the pod "
                   f"changed {MAX_ATTEMPTS} times while it was being bound; kube-scheduler will try again.")
        record_pod_event(self._core, args.pod_namespace, args.pod_name, args.pod_uid, "GPUShareBindFailed",
                         message, COMPONENT)
        return BindOutcome(error=message, conflicts=conflicts)

    def _attempt(self, args: BindingArgs) -> tuple[int, ...]:
        pod = self._read(args)
        if pod.node_name == args.node:
            return ()  # kube-scheduler retried a bind that had already succeeded
        if pod.node_name:
            raise _Failed(f"the pod is already bound to node {pod.node_name}")
        if not pod.is_active:
            raise _Failed("the pod is terminating or has finished")
        request = self._requests.request(pod)
        if self._hooks.after_read is not None:
            self._hooks.after_read(pod)
        # A pod without GPUs is reserved too (CPU and memory only, no annotations), so that the next
        # decision already sees it.
        reservation = self._reserve(pod, request, args.node)
        try:
            written = self._annotate(pod, request, reservation) if request.gpu_count else {}
            try:
                if self._hooks.before_binding is not None:
                    self._hooks.before_binding(pod)
                self._create_binding(args)
            except Exception:
                if written:
                    self._unannotate(pod, written)
                raise
        except BaseException:
            self._cache.release(reservation)
            raise
        return reservation.placement.gpu_indices

    def _read(self, args: BindingArgs) -> PodInfo:
        try:
            response = self._core.read_namespaced_pod(args.pod_name, args.pod_namespace, _preload_content=False,
                                                      _request_timeout=API_TIMEOUT_S)
        except ApiException as exc:
            if exc.status == 404:
                raise _Failed("the pod no longer exists") from None
            raise _Failed(f"reading the pod failed: {api_message(exc)}") from None
        pod = pod_info(orjson.loads(response.data))
        if args.pod_uid and pod.uid != args.pod_uid:
            raise _Failed(f"the pod was deleted and recreated (UID {pod.uid}, the scheduler asked for "
                          f"{args.pod_uid})")
        return pod

    def _reserve(self, pod: PodInfo, request: PodRequest, node_name: str) -> Reservation:
        try:
            policy = self._book.for_request(request)
        except ValueError as exc:
            raise _Failed(str(exc)) from None

        def choose(node: Node) -> tuple[int, ...] | None:
            candidate = policy.evaluate(node, request)
            return None if candidate is None else candidate.gpus

        try:
            return self._cache.reserve(node_name, pod.key, pod.uid, request, choose)
        except ReservationError as exc:
            raise _Failed(str(exc)) from None

    def _annotate(self, pod: PodInfo, request: PodRequest, reservation: Reservation) -> dict[str, str]:
        assignment = new_assignment(request, reservation.placement.gpu_indices, reservation.gpu_totals[0],
                                    reservation.unit, time.time_ns())
        annotations = assignment.annotations()
        body = {"metadata": {"resourceVersion": pod.resource_version, "annotations": annotations}}
        try:
            self._core.patch_namespaced_pod(pod.name, pod.namespace, body, _content_type=MERGE_PATCH,
                                            _preload_content=False, _request_timeout=API_TIMEOUT_S)
        except ApiException as exc:
            if exc.status == 409:
                raise _Conflict from None
            raise _Failed(f"writing the GPU annotations failed: {api_message(exc)}") from None
        return annotations

    def _unannotate(self, pod: PodInfo, annotations: dict[str, str]) -> None:
        body = {"metadata": {"annotations": dict.fromkeys(annotations)}}
        try:
            self._core.patch_namespaced_pod(pod.name, pod.namespace, body, _content_type=MERGE_PATCH,
                                            _preload_content=False, _request_timeout=API_TIMEOUT_S)
        except Exception as exc:  # the bind's own error is the one to report
            detail = api_message(exc) if isinstance(exc, ApiException) else str(exc)
            log.error("could not remove the GPU annotations of a pod whose bind failed; the next bind "
                      "overwrites them: %s", detail, extra={"pod": pod.key})

    def _create_binding(self, args: BindingArgs) -> None:
        body = client.V1Binding(
            metadata=client.V1ObjectMeta(name=args.pod_name, namespace=args.pod_namespace, uid=args.pod_uid or None),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=args.node))
        try:
            # Raw response: the client's model for Binding fails to deserialize some servers' answers.
            self._core.create_namespaced_binding(args.pod_namespace, body, _preload_content=False,
                                                 _request_timeout=API_TIMEOUT_S)
        except ApiException as exc:
            raise _Failed(f"creating the Binding failed: {api_message(exc)}") from None
