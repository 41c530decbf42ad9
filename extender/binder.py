"""bind: choose GPUs, hold them in the cache, record them on the pod, then bind the pod to its node.

Order matters. The reservation comes first so that concurrent binds never pick the same memory; the
annotations are written with the pod's resourceVersion as a precondition, so a pod changed since it was
read is re-read and re-decided rather than overwritten; the Binding comes last, so a pod never runs
without the annotations the device plugin needs. Any failure undoes what was done and comes back as a
sentence (kube-scheduler shows it in the pod's events; a non-200 status would show only "code 500").

Every bind has a time budget, below kube-scheduler's httpTimeout: each API call it makes, the Event included,
gets what is left of it as its timeout, and nothing is retried past it. When it runs out the bind undoes what
it did within ``UNDO_GRACE_S`` and answers a sentence, so kube-scheduler hears why before it gives up waiting.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from extender.placement import PolicyBook
from extender.wire import BindingArgs
from gpushare.cache.pending import PendingPods
from gpushare.cache.state import ClusterCache, Reservation, ReservationError
from gpushare.contract import PodInfo, PodRequest, RequestError, new_assignment, parse_request
from gpushare.kube.api import Conflict, KubeError, NotFound, Pods, Unavailable
from gpushare.kube.convert import pod_info
from gpushare.model import Node

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5
COMPONENT = "gpushare-extender"
# Under kube-scheduler's default httpTimeout (5 s) with room for the undo and the answer; see docs/extender.md.
DEFAULT_BUDGET_S = 3.0
# After the budget, the undo (removing annotations written) may take this much longer; then the bind answers.
UNDO_GRACE_S = 0.5


class Deadline:
    """A point in time, and what is left until it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._end = time.monotonic() + seconds

    def left(self) -> float:
        return self._end - time.monotonic()

    def extended(self, seconds: float) -> Deadline:
        """A deadline ``seconds`` after this one (at least ``seconds`` from now)."""
        return Deadline(max(self.left(), 0.0) + seconds)


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
    def __init__(self, pods: Pods, cache: ClusterCache, book: PolicyBook, pending: PendingPods,
                 budget_s: float = DEFAULT_BUDGET_S) -> None:
        self._pods = pods
        self._cache = cache
        self._book = book
        self._pending = pending
        self.budget_s = budget_s

    def bind(self, args: BindingArgs) -> BindOutcome:
        deadline = Deadline(self.budget_s)
        conflicts = 0
        who = f"pod {args.pod_namespace}/{args.pod_name} to node {args.node}"
        for attempt in range(MAX_ATTEMPTS):
            try:
                # The first attempt reads the pod from the watch; after a conflict, from the API server.
                gpus = self._attempt(args, deadline, fresh=attempt > 0)
            except _Changed:
                conflicts += 1
                continue
            except Exception as exc:  # every failure becomes the answer's Error, never a 500
                if not isinstance(exc, _Failed | RequestError | KubeError):
                    log.exception("unexpected failure while binding", extra={"node": args.node})
                message = f"gpushare could not bind {who}: {exc}"
                if isinstance(exc, Unavailable) and deadline.left() <= 0:
                    message = (f"gpushare could not bind {who} within its {self.budget_s:g} s budget, so it undid "
                               f"what it had done: {exc} kube-scheduler will try again.")
                log.warning(message, extra={"pod": f"{args.pod_namespace}/{args.pod_name}", "node": args.node})
                self._record_failure(args, message, deadline)
                return BindOutcome(error=message, conflicts=conflicts)
            log.info("bound pod", extra={"pod": f"{args.pod_namespace}/{args.pod_name}", "node": args.node,
                                         "gpus": list(gpus), "conflicts": conflicts})
            return BindOutcome(conflicts=conflicts, gpus=gpus)
        message = (f"gpushare could not bind {who}: the pod changed {MAX_ATTEMPTS} times while it was being bound; "
                   "kube-scheduler will try again.")
        self._record_failure(args, message, deadline)
        return BindOutcome(error=message, conflicts=conflicts)

    def _record_failure(self, args: BindingArgs, message: str, deadline: Deadline) -> None:
        if deadline.left() <= 0:
            # The answer matters more than the Event: kube-scheduler records the Error in the pod's events itself.
            log.info("no time left to record an Event of the failed bind",
                     extra={"pod": f"{args.pod_namespace}/{args.pod_name}"})
            return
        self._pods.record_event(args.pod_namespace, args.pod_name, args.pod_uid, reason="GPUShareBindFailed",
                                message=message, component=COMPONENT, timeout_s=deadline.left())

    def _attempt(self, args: BindingArgs, deadline: Deadline, fresh: bool) -> tuple[int, ...]:
        pod = self._read(args, deadline, fresh)
        if pod.node_name == args.node:
            return ()  # kube-scheduler retried a bind that had already succeeded
        if pod.node_name:
            raise _Failed(f"the pod is already bound to node {pod.node_name}")
        if not pod.is_active:
            raise _Failed("the pod is terminating or has finished")
        # Parsed from the pod just read, not taken from the cache of filter's parses: those are keyed by what the
        # sender says the UID and version are, and the GPUs written on the pod must follow the pod itself.
        request = self._cache.resolve(parse_request(pod))
        # A pod without GPUs is reserved too (CPU and memory only, no annotations), so that the next
        # decision already sees it.
        reservation = self._reserve(pod, request, args.node)
        try:
            written = self._annotate(pod, request, reservation, deadline) if request.gpu_count else None
            try:
                self._pods.bind(args.pod_namespace, args.pod_name, args.pod_uid, args.node, timeout_s=deadline.left())
            except Exception as exc:
                if written is not None:
                    # An answer means no Binding was made: the annotations go. Without one (a timeout, a lost
                    # connection) the Binding may have been made, and they go only if the pod is as we wrote it.
                    annotations, version = written
                    self._unannotate(pod, annotations, version if isinstance(exc, Unavailable) else None,
                                     deadline.extended(UNDO_GRACE_S))
                raise
        except BaseException:
            if not reservation.gang:  # a gang's plan keeps its GPUs for the pod's next bind, until its timeout
                self._cache.release(reservation)
            raise
        return reservation.placement.gpu_indices

    def _read(self, args: BindingArgs, deadline: Deadline, fresh: bool) -> PodInfo:
        """The pod as the watch shows it while it waits for a node; else (bound, unseen, another incarnation, or
        ``fresh``) as the API server says now."""
        seen = None if fresh else self._pending.get(args.pod_namespace, args.pod_name)
        if seen is not None and (not args.pod_uid or seen.uid == args.pod_uid):
            return seen
        try:
            pod = pod_info(self._pods.read(args.pod_namespace, args.pod_name, timeout_s=deadline.left()))
        except NotFound:
            raise _Failed("the pod no longer exists") from None
        if args.pod_uid and pod.uid != args.pod_uid:
            raise _Failed(f"the pod was deleted and recreated (UID {pod.uid}, the scheduler asked for "
                          f"{args.pod_uid})")
        return pod

    def _reserve(self, pod: PodInfo, request: PodRequest, node_name: str) -> Reservation:
        held = self._cache.gang_hold(pod.key)
        if held is not None and held.uid == pod.uid:
            if held.node != node_name:
                raise _Failed(f"its gang's plan holds its GPUs on node {held.node}")
            return held  # the GPUs the gang's plan chose, held since its filter
        try:
            policy = self._book.for_request(request)
        except ValueError as exc:
            raise _Failed(str(exc)) from None

        def choose(node: Node) -> tuple[int, ...] | None:
            candidate = self._book.evaluate(policy, node, request)
            return None if candidate is None else candidate.gpus

        try:
            return self._cache.reserve(node_name, pod.key, pod.uid, request, choose)
        except ReservationError as exc:
            raise _Failed(str(exc)) from None

    def _annotate(self, pod: PodInfo, request: PodRequest, reservation: Reservation,
                  deadline: Deadline) -> tuple[dict[str, str], str | None]:
        """Write the assignment; the annotations written and the pod's resourceVersion after the write."""
        assignment = new_assignment(request, reservation.placement.gpu_indices, reservation.gpu_totals[0],
                                    reservation.unit, time.time_ns())
        annotations = assignment.annotations()
        try:
            written = self._pods.annotate(pod.namespace, pod.name, pod.resource_version, annotations,
                                          timeout_s=deadline.left())
        except Conflict:
            raise _Changed from None
        except Unavailable:
            # The write may have landed without its answer: undo it unconditionally, it is ours if it is there.
            self._unannotate(pod, annotations, None, deadline.extended(UNDO_GRACE_S))
            raise
        version = written.get("metadata", {}).get("resourceVersion")
        return annotations, version if isinstance(version, str) and version else None

    def _unannotate(self, pod: PodInfo, annotations: dict[str, str], version: str | None, deadline: Deadline) -> None:
        """Remove the annotations this bind wrote, best effort within ``deadline``.

        With ``version`` (the pod as this bind wrote it) the removal happens only if nothing changed the pod
        since: a Binding whose answer was lost may have gone through, and a bound pod must keep its assignment
        for the device plugin. Annotations left on a pod that is not bound are harmless: the cache counts
        only bound pods, and the next bind overwrites them.
        """
        try:
            self._pods.annotate(pod.namespace, pod.name, version, dict.fromkeys(annotations),
                                timeout_s=deadline.left())
        except Conflict:
            log.info("the pod changed after its annotations were written (perhaps bound after all); they stay",
                     extra={"pod": pod.key})
        except KubeError as exc:  # the bind's own error is the one to report
            log.error("could not remove the GPU annotations of a pod whose bind failed; the next bind "
                      "overwrites them: %s", exc, extra={"pod": pod.key})
