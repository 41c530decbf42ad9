"""TLS for the extender, served and dialled, following certificate files that change on disk.

cert-manager renews a certificate well before it expires and the kubelet swaps the Secret volume's files
(an atomic rename of its ``..data`` symlink). A context loaded once at start would keep presenting the old
certificate until it expired, and then every filter and bind would fail; so both sides look at the files'
identity before each new connection and load them again when it changed. A half-written or mismatched set
(a hand edit in progress) is logged and skipped: the previous certificate keeps serving until the files are
whole again.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from extender.x509 import CertificateError, earliest_not_after, not_after, pem_certificates

log = logging.getLogger(__name__)

# A refused handshake is logged at most this often per reason, with how many were refused since: a scanner or a
# kube-scheduler with the wrong certificate retrying every pod must not flood the log.
REFUSAL_LOG_INTERVAL_S = 60.0
_DETAIL_CHARS = 160
# TLS 1.2's suites, forward-secret and AEAD only, as the CIS Kubernetes benchmark asks of the control plane's
# listeners: Python's default also offers CBC and finite-field DHE suites, which scanners flag and kube-scheduler's
# Go client never picks. TLS 1.3's suites are all AEAD.
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
# The client certificates /metrics reports are those admitted in the last hour: kube-scheduler opens connections
# every few pods, and a certificate it stopped presenting (renewed, or a replica gone) drops out. A bound keeps a
# client that presents a new certificate on every connection from growing the record.
CLIENT_CERTIFICATE_WINDOW_S = 3600.0
CLIENT_CERTIFICATES_KEPT = 64


class Refusal(StrEnum):
    """Why the listener refused a TLS handshake (the ``reason`` of ``gpushare_extender_tls_refused_handshakes``)."""

    PLAIN_HTTP = "plain_http"
    NO_CLIENT_CERTIFICATE = "no_client_certificate"
    CLIENT_CERTIFICATE = "client_certificate"
    CLIENT_NAME = "client_name"
    SERVER_CERTIFICATE = "server_certificate"
    OTHER = "other"

    @classmethod
    def of(cls, exc: ssl.SSLError) -> Refusal:
        if isinstance(exc, ClientNameRefused):
            return cls.CLIENT_NAME
        if isinstance(exc, ssl.SSLCertVerificationError):
            return cls.CLIENT_CERTIFICATE
        reason = exc.reason or ""
        if reason == "HTTP_REQUEST":
            return cls.PLAIN_HTTP
        if reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE":
            return cls.NO_CLIENT_CERTIFICATE
        # The client's alert when it does not trust the extender's certificate: Go sends "bad certificate",
        # OpenSSL "unknown ca", others "certificate unknown" or "certificate expired".
        if "ALERT" in reason and ("CERTIFICATE" in reason or "UNKNOWN_CA" in reason):
            return cls.SERVER_CERTIFICATE
        return cls.OTHER


_ADVICE = {
    Refusal.PLAIN_HTTP: "refused a client that spoke plain HTTP to the HTTPS listener: kube-scheduler's extender "
                        "entry needs enableHTTPS: true (the chart's scheduler configuration writes it)",
    Refusal.NO_CLIENT_CERTIFICATE: "refused a TLS client that presented no certificate: kube-scheduler's extender "
                                   "tlsConfig needs certFile and keyFile, a certificate that --tls-client-ca signed "
                                   "(the chart's schedulerConfig.tls.clientSecretName)",
    Refusal.CLIENT_CERTIFICATE: "refused a TLS client's certificate ({detail}): kube-scheduler must present a "
                                "certificate that the CA in --tls-client-ca signed, valid now",
    Refusal.CLIENT_NAME: "refused a TLS client whose certificate the client CA signed but {detail}: "
                         "kube-scheduler's certificate must name one of --tls-client-names as its common name or as "
                         "a DNS name (the chart's extender.tls.clientNames)",
    Refusal.SERVER_CERTIFICATE: "a TLS client refused the extender's certificate ({detail}): kube-scheduler's "
                                "tlsConfig caFile must hold the CA that signed --tls-cert, and the host of its "
                                "urlPrefix must be a name or address that certificate lists",
    Refusal.OTHER: "a TLS handshake failed ({detail}): the client may not speak TLS 1.2 or later, or may not be "
                   "kube-scheduler",
}


class ClientNameRefused(ssl.SSLCertVerificationError):
    """A client certificate that the client CA signed but that names none of the names allowed."""

    def __init__(self, names: tuple[str, ...], allowed: frozenset[str]) -> None:
        super().__init__(1, "the client certificate names none of --tls-client-names")
        self.reason = "CLIENT_NAME_NOT_ALLOWED"
        self.verify_message = (f"it names {', '.join(names) or 'nothing'}, none of {', '.join(sorted(allowed))}")


def certificate_names(certificate: Mapping[str, Any]) -> tuple[str, ...]:
    """A verified peer certificate's (``getpeercert()``'s) subject common names and DNS names."""
    common = [value for rdn in certificate.get("subject", ()) for key, value in rdn if key == "commonName"]
    dns = [value for kind, value in certificate.get("subjectAltName", ()) if kind == "DNS"]
    return tuple(common + dns)


class Refusals:
    """The handshakes the listener refused, counted per reason, each reason logged at most once a minute.

    Without it a refused handshake leaves no trace on the extender's side: the event loop drops the connection
    and logs nothing, and a kube-scheduler with the wrong certificate fails every GPU pod with only its own
    log to say why.
    """

    def __init__(self) -> None:
        # Every reason from the start, so a scrape (another thread) never sees the dict change size.
        self.counts = dict.fromkeys(Refusal, 0)
        self._unlogged = dict.fromkeys(Refusal, 0)
        self._logged_at: dict[Refusal, float] = {}

    def refused(self, exc: ssl.SSLError) -> None:
        refusal = Refusal.of(exc)
        self.counts[refusal] += 1
        now = time.monotonic()
        last = self._logged_at.get(refusal)
        if last is not None and now - last < REFUSAL_LOG_INTERVAL_S:
            self._unlogged[refusal] += 1
            return
        self._logged_at[refusal] = now
        since, self._unlogged[refusal] = self._unlogged[refusal], 0
        detail = (getattr(exc, "verify_message", None) or exc.reason or str(exc))[:_DETAIL_CHARS]
        more = f" ({since} more refused for this reason since the last such line)" if since else ""
        log.warning("%s%s", _ADVICE[refusal].format(detail=detail), more, extra={"reason": refusal.value})


class ClientCertificates:
    """The client certificates the listener admitted lately, by DER: when each expires and when it was last seen.

    kube-scheduler's client certificate expiring fails every GPU pod as surely as the extender's own, and whether a
    renewed one is in use shows only in what kube-scheduler presents. Times are the caller's (``time.monotonic()``)
    so that the record stays a plain function of what it was told.
    """

    def __init__(self) -> None:
        self._seen: dict[bytes, tuple[datetime, float]] = {}

    def admitted(self, der: bytes, now: float) -> None:
        known = self._seen.pop(der, None)
        try:
            expires = known[0] if known is not None else not_after(der)
        except CertificateError:  # OpenSSL verified it, so this is rare; the gauge leaves it out
            return
        self._seen[der] = (expires, now)  # re-inserted: the dict stays ordered by when each was last seen
        if len(self._seen) > CLIENT_CERTIFICATES_KEPT:
            del self._seen[next(iter(self._seen))]

    def earliest_expiration(self, now: float) -> datetime | None:
        """The first to expire of the certificates admitted within ``CLIENT_CERTIFICATE_WINDOW_S`` before ``now``."""
        recent = [expires for expires, seen in list(self._seen.values()) if now - seen <= CLIENT_CERTIFICATE_WINDOW_S]
        return min(recent, default=None)


def expiration_fields(expiration: Mapping[str, datetime]) -> dict[str, str]:
    """``ServerTLS.expiration``'s dates as log fields: ``serving_expires`` and the like, in ISO 8601."""
    return {f"{name}_expires": when.isoformat() for name, when in expiration.items()}


def _observed_by(refusals: Refusals, admit: Callable[[ssl.SSLObject], None]) -> type[ssl.SSLObject]:
    """The listener's class of TLS connection: a completed handshake goes through ``admit``, which may refuse it,
    and ``refusals`` hears of every handshake that failed."""

    class ObservedSSLObject(ssl.SSLObject):
        def do_handshake(self) -> None:
            try:
                super().do_handshake()
                admit(self)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                raise  # more bytes to come: the handshake goes on
            except ssl.SSLError as exc:
                refusals.refused(exc)
                raise

    return ObservedSSLObject


_Stamp = tuple[tuple[int, int, int, int], ...]


def _stamp(paths: tuple[Path, ...]) -> _Stamp:
    """What changes when any file is replaced: the target's device, inode, size and mtime (symlinks followed)."""
    stamps = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            stamps.append((-1, -1, -1, -1))  # mid-swap or removed: a change, and the load will say what is wrong
            continue
        stamps.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(stamps)


class ServerTLS:
    """The extender's serving context: with ``client_ca``, a handshake without a certificate it signed fails.

    ``context`` is what the listener is given. It asks for a client certificate itself (OpenSSL keeps the
    verify mode of the context a connection started with), and on every ClientHello hands the connection to
    the context loaded from the files as they are now, so a renewed certificate or client CA applies from the
    next connection on without a restart and without failing one already open.
    """

    def __init__(self, cert: Path, key: Path, client_ca: Path | None, client_names: frozenset[str] = frozenset()
                 ) -> None:
        self._cert, self._key, self._client_ca = cert, key, client_ca
        self._client_names = client_names
        self._paths = (cert, key) if client_ca is None else (cert, key, client_ca)
        self._seen = _stamp(self._paths)
        # ClientHellos reload on the event loop and /metrics on its own thread; one reload at a time keeps the
        # files' stamp, the context and the certificates' dates of one moment together.
        self._reloading = threading.Lock()
        self._current = self._load()  # an unreadable file at start is the caller's error to report
        chain = pem_certificates(cert.read_text())
        self._expiration = self._read_expiration(chain)
        # The replicas forward binds to the leader presenting this same certificate (the chart mounts one Secret):
        # it is admitted whatever it names, and so is the one before a renewal, which another replica's kubelet may
        # not have replaced yet.
        self._own: tuple[bytes, ...] = (chain[0],)
        self.context = self._load()
        self.context.sni_callback = self._on_client_hello
        self.refusals = Refusals()
        self.clients = ClientCertificates()
        # The event loop wraps each accepted connection in the context's ``sslobject_class`` (uvloop's and
        # asyncio's TLS both do), and the ClientHello's hand-off to ``current()`` keeps the object.
        self.context.sslobject_class = _observed_by(self.refusals, self._admit)

    @property
    def mutual(self) -> bool:
        return self._client_ca is not None

    def _load(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_ciphers(TLS12_CIPHERS)
        # kube-scheduler's client keeps no TLS session cache (client-go sets none), so every connection it opens is
        # a full handshake and a session ticket is never used; issuing TLS 1.3's default two on each connection cost
        # a quarter of the handshake's CPU (docs/extender.md, "Mutual TLS and connections").
        context.num_tickets = 0
        context.load_cert_chain(self._cert, self._key)
        if self._client_ca is not None:
            context.load_verify_locations(cafile=self._client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def current(self) -> ssl.SSLContext:
        """The context for a new connection, loaded again first if any of the files changed since."""
        seen = _stamp(self._paths)
        if seen == self._seen:
            return self._current
        with self._reloading:
            if seen == self._seen:  # another thread loaded these files while this one waited
                return self._current
            try:
                current = self._load()
                chain = pem_certificates(self._cert.read_text())
            except (OSError, ValueError, ssl.SSLError) as exc:
                log.warning("the TLS files changed but could not be loaded; still serving the previous certificate "
                            "and client CA: %s", exc, extra={"cert": str(self._cert)})
                return self._current
            self._current = current
            if chain[0] != self._own[0]:  # a new client CA, or the same files written again, renews nothing
                self._own = (chain[0], self._own[0])
            self._expiration = self._read_expiration(chain)
            self._seen = seen
            log.info("loaded the renewed TLS certificate",
                     extra={"cert": str(self._cert), **expiration_fields(self._expiration)})
            return self._current

    def expiration(self) -> dict[str, datetime]:
        """When the certificate the next connection is served (its chain's first to expire), the client CA bundle
        (its first CA to expire) and the clients' certificates admitted lately (the first to expire) stop being
        valid, the files loaded again first if they changed.

        A renewal on disk shows here before any client connects, so an alert on it does not fire for a certificate
        already replaced in a quiet cluster.
        """
        self.current()
        client = self.clients.earliest_expiration(time.monotonic())
        return self._expiration if client is None else {**self._expiration, "client": client}

    def _read_expiration(self, chain: list[bytes]) -> dict[str, datetime]:
        """When the served ``chain`` and the client CA file expire; one OpenSSL loaded but whose dates cannot be read
        (rare) is logged and left out of /metrics."""
        dates = {}
        try:
            dates["serving"] = earliest_not_after(chain)
        except CertificateError as exc:
            log.warning("could not read when the TLS file %s expires, so /metrics leaves it out: %s", self._cert, exc)
        if self._client_ca is not None:
            try:
                dates["client_ca"] = earliest_not_after(pem_certificates(self._client_ca.read_text()))
            except (OSError, CertificateError) as exc:
                log.warning("could not read when the TLS file %s expires, so /metrics leaves it out: %s",
                            self._client_ca, exc)
        return dates

    def _on_client_hello(self, connection: ssl.SSLObject | ssl.SSLSocket, _server_name: str | None,
                         _context: ssl.SSLContext) -> None:
        connection.context = self.current()

    def _admit(self, connection: ssl.SSLObject) -> None:
        """Refuse a verified client certificate that names none of ``client_names``, when they are given; note when
        each admitted one expires, the replicas' own aside (it is the serving certificate)."""
        der = connection.getpeercert(binary_form=True)
        if der is None or der in self._own:
            return
        if self._client_names:
            certificate = connection.getpeercert()
            names = certificate_names(certificate) if certificate else ()
            if self._client_names.isdisjoint(names):
                raise ClientNameRefused(names, self._client_names)
        self.clients.admitted(der, time.monotonic())


class ClientTLS:
    """A follower's context for dialling the leader: trusts ``ca`` and presents ``cert`` when given one.

    The certificate and CA are loaded again into the same context when their files change; ``refresh`` runs
    on the event loop before each forward, so no connection is being opened while the context changes.
    """

    def __init__(self, ca: Path | None, cert: Path | None = None, key: Path | None = None) -> None:
        self._ca, self._cert, self._key = ca, cert, key
        self._paths = tuple(path for path in (ca, cert, key) if path is not None)
        self._seen = _stamp(self._paths)
        # The leader's certificate names the Service, not the pod address dialled; the CA is what is checked.
        self.context = ssl.create_default_context(cafile=str(ca) if ca is not None else None)
        self.context.check_hostname = ca is None
        self._load()

    def _load(self) -> None:
        if self._ca is not None:
            self.context.load_verify_locations(cafile=self._ca)
        if self._cert is not None and self._key is not None:
            self.context.load_cert_chain(self._cert, self._key)

    def refresh(self) -> None:
        seen = _stamp(self._paths)
        if seen == self._seen:
            return
        try:
            self._load()
        except (OSError, ssl.SSLError) as exc:
            log.warning("the TLS files for reaching the leader changed but could not be loaded; still using the "
                        "previous ones: %s", exc)
            return
        self._seen = seen
