"""bind: choose GPUs, hold them in the cache, then bind the pod to its node with them in one write.

Order matters. The reservation comes first so that concurrent binds never pick the same memory; it is made on the
event loop as the request is read, from the watch's copy of the pod (``Binder.hold``), so that a filter kube-scheduler
sends after the bind is answered with it, and only the calls to the API server wait in the bind's thread. Then one
Binding carries the assignment as annotations, which the API server merges into the pod as it sets the node
(so the device plugin never sees the pod on its node without them), with the pod's UID and the
resourceVersion just read as preconditions: a pod changed since it was read is re-read and re-decided rather
than overwritten. One write is what kube-scheduler's own bind costs the API server, and a Binding refused
writes nothing, so a failure only releases the reservation and comes back as a sentence (kube-scheduler shows
it in the pod's events; a non-200 status would show only "code 500").

Every bind has a time budget, below kube-scheduler's httpTimeout: each API call it makes, the Event included,
gets what is left of it as its timeout, and nothing is retried past it; then the bind answers a sentence, so
kube-scheduler hears why before it gives up waiting.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from extender.placement import PolicyBook
from extender.wire import BindingArgs
from gpushare.cache.pending import PendingPods
from gpushare.cache.state import ClusterCache, Reservation, ReservationError
from gpushare.contract import PodInfo, PodRequest, RequestError, new_assignment, parse_request
from gpushare.kube.api import Conflict, KubeError, NotFound, Pods, Unavailable
from gpushare.kube.convert import pod_info

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5
COMPONENT = "gpushare-extender"
# Under kube-scheduler's default httpTimeout (5 s) with room for the answer; see docs/extender.md.
DEFAULT_BUDGET_S = 3.0


class Deadline:
    """A point in time, and what is left until it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._end = time.monotonic() + seconds

    def left(self) -> float:
        return self._end - time.monotonic()


@dataclass(frozen=True, slots=True)
class BindOutcome:
    error: str = ""
    conflicts: int = 0
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Hold:
    """A bind's attempt up to its Binding: the pod as read, its request, and the reservation made for it."""

    pod: PodInfo
    request: PodRequest
    reservation: Reservation


class _Changed(Exception):
    """The pod changed between read and Binding; read it again and decide again."""


class _Failed(Exception):
    """The bind cannot succeed; the text is the user's explanation."""


class Binder:
    def __init__(self, pods: Pods, cache: ClusterCache, book: PolicyBook, pending: PendingPods,
                 reserved: Callable[[], None], budget_s: float = DEFAULT_BUDGET_S) -> None:
        """``reserved`` is called after each reservation, before the Binding is sent (``Verbs.catch_up``)."""
        self._pods = pods
        self._cache = cache
        self._book = book
        self._pending = pending
        self._reserved = reserved
        self.budget_s = budget_s

    def hold(self, args: BindingArgs) -> Hold | None:
        """The first attempt's checks and reservation, in memory only (no API call): for the event loop, so that the
        next filter sees the reservation. ``None`` when the watch does not show the pod waiting for a node (``bind``
        reads it from the API server), or when nothing is to be reserved or the pod cannot be (``bind``'s first
        attempt meets the same and answers it, with its Event)."""
        seen = self._waiting(args)
        if seen is None:
            return None
        try:
            return self._hold(args, seen)
        except Exception:  # the thread's first attempt meets it again: it answers it, and logs the unexpected
            return None

    def bind(self, args: BindingArgs, held: Hold | None = None) -> BindOutcome:
        """Bind the pod as ``args`` ask, within the budget; ``held``: its first attempt's ``hold``, if one was made."""
        deadline = Deadline(self.budget_s)
        conflicts = 0
        who = f"pod {args.pod_namespace}/{args.pod_name} to node {args.node}"
        for attempt in range(MAX_ATTEMPTS):
            try:
                # The first attempt reads the pod from the watch; after a conflict, from the API server.
                gpus = self._attempt(args, deadline, fresh=attempt > 0, held=held if attempt == 0 else None)
            except _Changed:
                conflicts += 1
                continue
            except Exception as exc:  # every failure becomes the answer's Error, never a 500
                if not isinstance(exc, _Failed | RequestError | KubeError):
                    log.exception("unexpected failure while binding", extra={"node": args.node})
                message = f"gpushare could not bind {who}: {exc}"
                if isinstance(exc, Unavailable) and deadline.left() <= 0:
                    message = (f"gpushare could not bind {who} within its {self.budget_s:g} s budget: {exc} "
                               "kube-scheduler will try again.")
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

    def _attempt(self, args: BindingArgs, deadline: Deadline, fresh: bool, held: Hold | None) -> tuple[int, ...]:
        if held is None:
            held = self._hold(args, self._read(args, deadline, fresh))
            if held is None:
                return ()  # kube-scheduler retried a bind that had already succeeded
        reservation = held.reservation
        try:
            self._reserved()
            self._bind(held.pod, held.request, reservation, args.node, deadline)
        except BaseException:
            if not reservation.gang:  # a gang's plan keeps its GPUs for the pod's next bind, until its timeout
                self._cache.release(reservation)
            raise
        return reservation.placement.gpu_indices

    def _hold(self, args: BindingArgs, pod: PodInfo) -> Hold | None:
        """Check the pod just read and reserve its node's resources for it; ``None`` if it is bound there already."""
        if pod.node_name == args.node:
            return None
        if pod.node_name:
            raise _Failed(f"the pod is already bound to node {pod.node_name}")
        if not pod.is_active:
            raise _Failed("the pod is terminating or has finished")
        # Parsed from the pod just read, not taken from the cache of filter's parses: those are keyed by what the
        # sender says the UID and version are, and the GPUs written on the pod must follow the pod itself.
        request = self._cache.resolve(parse_request(pod))
        # A pod without GPUs is reserved too (CPU and memory only, no annotations), so that the next
        # decision already sees it.
        return Hold(pod, request, self._reserve(pod, request, args.node))

    def _read(self, args: BindingArgs, deadline: Deadline, fresh: bool) -> PodInfo:
        """The pod as the watch shows it while it waits for a node; else (bound, unseen, another incarnation, or
        ``fresh``) as the API server says now."""
        seen = None if fresh else self._waiting(args)
        if seen is not None:
            return seen
        try:
            pod = pod_info(self._pods.read(args.pod_namespace, args.pod_name, timeout_s=deadline.left()))
        except NotFound:
            raise _Failed("the pod no longer exists") from None
        if args.pod_uid and pod.uid != args.pod_uid:
            raise _Failed(f"the pod was deleted and recreated (UID {pod.uid}, the scheduler asked for "
                          f"{args.pod_uid})")
        return pod

    def _waiting(self, args: BindingArgs) -> PodInfo | None:
        """The pod as the watch shows it waiting for a node, if it is the incarnation ``args`` name."""
        seen = self._pending.get(args.pod_namespace, args.pod_name)
        return seen if seen is not None and (not args.pod_uid or seen.uid == args.pod_uid) else None

    def _reserve(self, pod: PodInfo, request: PodRequest, node_name: str) -> Reservation:
        held = self._cache.gang_hold(pod.key)
        if held is not None and held.uid == pod.uid:
            if held.node != node_name:
                raise _Failed(f"its gang's plan holds its GPUs on node {held.node}")
            return held  # the GPUs the gang's plan chose, held since its filter
        chosen = self._cache.take_filter_hold(pod.key, pod.uid, node_name, request)
        if chosen is not None:
            return chosen  # the GPUs filter chose, held since
        try:
            policy = self._book.for_request(request)
        except ValueError as exc:
            raise _Failed(str(exc)) from None
        try:
            return self._cache.reserve(node_name, pod.key, pod.uid, request, self._book.chooser(policy, request))
        except ReservationError as exc:
            raise _Failed(str(exc)) from None

    def _bind(self, pod: PodInfo, request: PodRequest, reservation: Reservation, node: str,
              deadline: Deadline) -> None:
        """The Binding, with the assignment for a GPU pod; a pod without GPUs is bound as kube-scheduler binds it.

        A Conflict is a pod changed since it was read, or bound by someone else meanwhile: the next attempt
        reads it from the API server and tells which. Without an answer (a timeout, a lost connection) the
        Binding may have been made, with its annotations; the watch then shows the pod bound and counts it.
        """
        annotations, version = None, None
        if request.gpu_count:
            assignment = new_assignment(request, reservation.placement.gpu_indices, reservation.gpu_totals[0],
                                        reservation.unit, time.time_ns())
            annotations, version = assignment.annotations(), pod.resource_version
        try:
            self._pods.bind(pod.namespace, pod.name, pod.uid, node, annotations=annotations,
                            resource_version=version, timeout_s=deadline.left())
        except Conflict:
            raise _Changed from None
