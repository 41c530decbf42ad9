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
from dataclasses import dataclass

from extender.placement import PolicyBook, RequestCache
from extender.wire import BindingArgs
from gpushare.cache.state import ClusterCache, Reservation, ReservationError
from gpushare.contract import PodInfo, PodRequest, RequestError, new_assignment
from gpushare.kube.api import Conflict, KubeError, NotFound, Pods
from gpushare.kube.convert import pod_info
from gpushare.model import Node

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5
COMPONENT = "gpushare-extender"


@dataclass(frozen=True, slots=True)
class BindOutcome:
    error: str = ""
    conflicts: int = 0
    gpus: tuple[int, ...] = ()


class _Changed(Exception):
    """The pod changed between read and patch; read it again and decide again."""


class _Failed(Exception):
    """The bind cannot succeed; the text is the user's explanation."""


class Binder:
    def __init__(self, pods: Pods, cache: ClusterCache, book: PolicyBook, requests: RequestCache) -> None:
        self._pods = pods
        self._cache = cache
        self._book = book
        self._requests = requests

    def bind(self, args: BindingArgs) -> BindOutcome:
        conflicts = 0
        for _ in range(MAX_ATTEMPTS):
            try:
                gpus = self._attempt(args)
            except _Changed:
                conflicts += 1
                continue
            except Exception as exc:  # every failure becomes the answer's Error, never a 500
                if not isinstance(exc, _Failed | RequestError | KubeError):
                    log.exception("unexpected failure while binding", extra={"node": args.node})
                message = f"gpushare could not bind pod {args.pod_namespace}/{args.pod_name} to node {args.node}: {exc}"
                log.warning(message, extra={"pod": f"{args.pod_namespace}/{args.pod_name}", "node": args.node})
                self._record_failure(args, message)
                return BindOutcome(error=message, conflicts=conflicts)
            log.info("bound pod", extra={"pod": f"{args.pod_namespace}/{args.pod_name}", "node": args.node,
                                         "gpus": list(gpus), "conflicts": conflicts})
            return BindOutcome(conflicts=conflicts, gpus=gpus)
        message = (f"gpushare could not bind pod {args.pod_namespace}/{args.pod_name} to node {args.node}: the pod "
                   f"changed {MAX_ATTEMPTS} times while it was being bound; kube-scheduler will try again.")
        self._record_failure(args, message)
        return BindOutcome(error=message, conflicts=conflicts)

    def _record_failure(self, args: BindingArgs, message: str) -> None:
        self._pods.record_event(args.pod_namespace, args.pod_name, args.pod_uid, reason="GPUShareBindFailed",
                                message=message, component=COMPONENT)

    def _attempt(self, args: BindingArgs) -> tuple[int, ...]:
        pod = self._read(args)
        if pod.node_name == args.node:
            return ()  # kube-scheduler retried a bind that had already succeeded
        if pod.node_name:
            raise _Failed(f"the pod is already bound to node {pod.node_name}")
        if not pod.is_active:
            raise _Failed("the pod is terminating or has finished")
        request = self._requests.request(pod)
        # A pod without GPUs is reserved too (CPU and memory only, no annotations), so that the next
        # decision already sees it.
        reservation = self._reserve(pod, request, args.node)
        try:
            written = self._annotate(pod, request, reservation) if request.gpu_count else {}
            try:
                self._pods.bind(args.pod_namespace, args.pod_name, args.pod_uid, args.node)
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
            pod = pod_info(self._pods.read(args.pod_namespace, args.pod_name))
        except NotFound:
            raise _Failed("the pod no longer exists") from None
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
        try:
            self._pods.annotate(pod.namespace, pod.name, pod.resource_version, annotations)
        except Conflict:
            raise _Changed from None
        return annotations

    def _unannotate(self, pod: PodInfo, annotations: dict[str, str]) -> None:
        try:
            self._pods.annotate(pod.namespace, pod.name, None, dict.fromkeys(annotations))
        except KubeError as exc:  # the bind's own error is the one to report
            log.error("could not remove the GPU annotations of a pod whose bind failed; the next bind "
                      "overwrites them: %s", exc, extra={"pod": pod.key})
