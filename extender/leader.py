"""Leader election over a ``coordination.k8s.io/v1`` Lease: of several extender replicas, only one binds.

Binds reserve GPUs in the binding replica's own cache, so two replicas binding at once could both hand out
the same memory before either watch shows the other's pod. The replica that holds the Lease binds; the
others forward binds to the address it publishes in the Lease's ``gpushare.io/leader-url`` annotation.

The rules are client-go's: a Lease is free when it has no holder, or when it has not changed for
``leaseDurationSeconds`` by the observer's own clock (clocks of different machines are never compared).
Every write carries the resourceVersion just read, so a 409 means another replica wrote first. A leader
counts itself leader only until ``lease duration - renew period`` after the start of its last successful
renewal, which is earlier than any other replica may take over, so two replicas never both believe they lead.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpushare.kube.api import Conflict, Leases, NotFound, Obj

log = logging.getLogger(__name__)

LEADER_URL_ANNOTATION = "gpushare.io/leader-url"
DEFAULT_LEASE_NAME = "gpushare-extender"
DEFAULT_LEASE_DURATION_S = 15
DEFAULT_RENEW_PERIOD_S = 5.0
WAIT_TO_LEAD_S = 0.1


@dataclass(frozen=True)
class LeaseSettings:
    """Which Lease the replicas contend for, who this replica is, and how peers reach it."""

    namespace: str
    identity: str
    advertise_url: str
    name: str = DEFAULT_LEASE_NAME
    duration_s: int = DEFAULT_LEASE_DURATION_S
    renew_period_s: float = DEFAULT_RENEW_PERIOD_S


@dataclass(frozen=True, slots=True)
class LeaderView:
    """What this replica knows of the leadership: whether it leads, and who does and where."""

    is_leader: bool
    holder: str = ""
    leader_url: str = ""


def _micro_time() -> str:
    """Now as a Kubernetes MicroTime."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Contends for the Lease on a background thread; ``is_leader`` may be read from any thread.

    The elector contends once ``can_lead``
    is true: the extender passes "my cache has finished its first list", so a new leader never binds from an
    empty cache.
    """

    def __init__(self, leases: Leases, settings: LeaseSettings, can_lead: Callable[[], bool]) -> None:
        self.settings = settings
        self._leases = leases
        self._can_lead = can_lead
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._held_until: float | None = None  # monotonic deadline of this replica's leadership
        self._seen = LeaderView(is_leader=False)
        self._observed_version = ""
        self._observed_at = 0.0
        self._request_timeout_s = max(1.0, settings.renew_period_s)

    @property
    def is_leader(self) -> bool:
        held_until = self._held_until
        return held_until is not None and time.monotonic() < held_until

    def view(self) -> LeaderView:
        seen = self._seen
        return LeaderView(self.is_leader, seen.holder, seen.leader_url)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop contending and, if this replica holds the Lease, hand it back so a peer takes over at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._request_timeout_s * 2 + 1)
        self._held_until = None
        if self._seen.holder == self.settings.identity:
            self._release()

    def _run(self) -> None:
        while not self._can_lead():
            if self._stop.wait(WAIT_TO_LEAD_S):
                return
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as exc:  # the election must outlive API hiccups
                log.warning("could not read or write leader lease %s/%s: %s", self.settings.namespace,
                            self.settings.name, exc, extra={"lease": self._lease_key()})
            self._stop.wait(self.settings.renew_period_s)

    def _lease_key(self) -> str:
        return f"{self.settings.namespace}/{self.settings.name}"

    def _tick(self) -> None:
        started = time.monotonic()
        lease = self._read()
        if lease is None:
            self._create(started)
            return
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        version = str(lease["metadata"].get("resourceVersion", ""))
        now = time.monotonic()
        if version != self._observed_version:
            self._observed_version, self._observed_at = version, now
        duration = int(spec.get("leaseDurationSeconds") or self.settings.duration_s)
        if holder and holder != self.settings.identity and now < self._observed_at + duration:
            url = str((lease["metadata"].get("annotations") or {}).get(LEADER_URL_ANNOTATION, ""))
            self._follow(holder, url)
            return
        self._write(lease, started)

    def _read(self) -> Obj | None:
        try:
            return self._leases.read(self.settings.namespace, self.settings.name, timeout_s=self._request_timeout_s)
        except NotFound:
            return None

    def _leader_spec(self, now: str) -> Obj:
        return {"holderIdentity": self.settings.identity, "leaseDurationSeconds": self.settings.duration_s,
                "acquireTime": now, "renewTime": now}

    def _create(self, started: float) -> None:
        now = _micro_time()
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.settings.name, "namespace": self.settings.namespace,
                             "annotations": {LEADER_URL_ANNOTATION: self.settings.advertise_url}},
                "spec": {**self._leader_spec(now), "leaseTransitions": 0}}
        try:
            self._leases.create(self.settings.namespace, body, timeout_s=self._request_timeout_s)
        except Conflict:  # another replica created it first; it leads
            return
        self._lead(started)

    def _write(self, lease: Obj, started: float) -> None:
        """Acquire a free Lease or renew our own, on the condition that nobody wrote it since we read it."""
        spec = dict(lease.get("spec") or {})
        now = _micro_time()
        if spec.get("holderIdentity") == self.settings.identity:
            spec.update(holderIdentity=self.settings.identity, leaseDurationSeconds=self.settings.duration_s,
                        renewTime=now)
        else:
            transitions = int(spec.get("leaseTransitions") or 0) + 1
            spec.update(self._leader_spec(now), leaseTransitions=transitions)
        metadata = dict(lease["metadata"])
        metadata["annotations"] = {**(metadata.get("annotations") or {}),
                                   LEADER_URL_ANNOTATION: self.settings.advertise_url}
        try:
            written = self._leases.replace(self.settings.namespace, self.settings.name,
                                           {**lease, "metadata": metadata, "spec": spec},
                                           timeout_s=self._request_timeout_s)
        except Conflict:  # written by another replica since we read it: it won
            self._step_down("another replica wrote the lease first")
            return
        self._observed_version = str(written["metadata"].get("resourceVersion", ""))
        self._observed_at = time.monotonic()
        self._lead(started)

    def _lead(self, started: float) -> None:
        if self._stop.is_set():
            return  # stop() is handing the lease back
        was_leader = self.is_leader
        self._held_until = started + self.settings.duration_s - self.settings.renew_period_s
        self._seen = LeaderView(True, self.settings.identity, self.settings.advertise_url)
        if not was_leader:
            log.info("became the leader: this replica binds", extra={"lease": self._lease_key(),
                                                                     "identity": self.settings.identity})

    def _follow(self, holder: str, url: str) -> None:
        self._step_down(f"replica {holder or '(none)'} holds the lease")
        if self._seen != LeaderView(False, holder, url):
            self._seen = LeaderView(False, holder, url)
            log.info("following the leader", extra={"lease": self._lease_key(), "holder": holder, "url": url})

    def _step_down(self, why: str) -> None:
        if self._held_until is None:
            return
        self._held_until = None
        log.warning("lost the leadership: %s", why, extra={"lease": self._lease_key()})

    def _release(self) -> None:
        """Clear the holder so that a peer need not wait for the lease to expire."""
        try:
            lease = self._read()
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.settings.identity:
                return
            spec = {**lease["spec"], "holderIdentity": None, "renewTime": _micro_time()}
            metadata = dict(lease["metadata"])
            metadata["annotations"] = {k: v for k, v in (metadata.get("annotations") or {}).items()
                                       if k != LEADER_URL_ANNOTATION}
            self._leases.replace(self.settings.namespace, self.settings.name,
                                 {**lease, "metadata": metadata, "spec": spec}, timeout_s=self._request_timeout_s)
        except Exception as exc:  # the peers take over when the lease expires instead
            log.warning("could not hand back leader lease %s; another replica takes over once it expires: %s",
                        self._lease_key(), exc, extra={"lease": self._lease_key()})
            return
        log.info("handed back the leader lease", extra={"lease": self._lease_key()})
