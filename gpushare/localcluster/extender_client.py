"""The scheduler loop's HTTP client for the extender: kept-alive connections pooled as kube-scheduler's are.

The loop stands in for kube-scheduler, whose Go client costs a few microseconds per call; whatever this client
spends is counted in the extender's latency. ``http.client`` over a kept-alive connection spends about 0.08 ms of
CPU per 500-name filter, against 0.18 ms for urllib3's pool (which checks, locks and wraps every request) and twice
that for httpx. A request goes out in one write, as Go's client sends it (``_OneWrite``).

kube-scheduler's extender client is a Go ``http.Transport`` with ``MaxIdleConnsPerHost`` unset, so Go's default
of two idle connections per host holds: a call takes the idle connection returned last, or opens one when none is
idle, and a connection returned while two are idle is closed. With binds in flight beside the next filter, that
opens and closes connections as the calls in flight outnumber two, and the extender accepts each one; a client
that kept a connection per thread would spare it that work, which production does not.
"""

from __future__ import annotations

import http.client
import select
import ssl
import threading
from urllib.parse import urlsplit

# Go's http.Transport keeps at most this many idle connections per host (``DefaultMaxIdleConnsPerHost``), and
# kube-scheduler's extender transport leaves it so (REFERENCE.md 1b).
MAX_IDLE_CONNECTIONS = 2


class _OneWrite(http.client.HTTPConnection):
    """Writes a request's head and body with one send.

    ``request`` writes them with two, and between the two the calling thread gives up the GIL and may wait a
    switch interval to get it back behind the loop's bind and watch threads, while the extender, which already
    has the head, waits for the body. kube-scheduler's Go client writes them back to back.
    """

    _body = b""

    def post(self, path: str, body: bytes) -> None:
        self.putrequest("POST", path, skip_accept_encoding=True)
        self.putheader("Content-Type", "application/json")
        self.putheader("Content-Length", str(len(body)))
        self._body = body
        self.endheaders()  # sends the head through ``send``, which adds the body

    def send(self, data: object) -> None:
        body, self._body = self._body, b""
        if not isinstance(data, bytes):  # http.client writes a head as bytes, and nothing else is sent here
            raise TypeError(f"only bytes are sent on this connection, not {type(data).__name__}")
        super().send(data + body)


class _OneWriteTLS(_OneWrite, http.client.HTTPSConnection):
    """``_OneWrite`` over TLS."""


class ExtenderClient:
    """POSTs to ``base_url``'s verbs over kept-alive connections, at most ``MAX_IDLE_CONNECTIONS`` of them idle."""

    def __init__(self, base_url: str, timeout_s: float, tls: ssl.SSLContext | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"The extender URL {base_url!r} must be http:// or https:// with a host.")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._path = parts.path.rstrip("/")
        self._timeout_s = timeout_s
        self._tls = tls or (ssl.create_default_context() if self._https else None)
        self._lock = threading.Lock()
        self._idle: list[_OneWrite] = []  # the one returned last at the end, taken first
        self._open: set[_OneWrite] = set()
        self.opened = 0
        """Connections opened so far (the extender accepted as many)."""

    def post(self, verb: str, body: bytes) -> tuple[int, bytes]:
        """The status and body of the answer; ``OSError`` or ``http.client.HTTPException`` when there is none."""
        connection = self._take()
        try:
            connection.post(f"{self._path}/{verb}", body)
            response = connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException):
            self._drop(connection)
            raise
        if response.will_close:
            self._drop(connection)
        else:
            self._give_back(connection)
        return response.status, data

    def close(self) -> None:
        with self._lock:
            connections, self._open, self._idle = self._open, set(), []
        for connection in connections:
            connection.close()

    def _take(self) -> _OneWrite:
        """The idle connection returned last that the server has not closed, else a new one."""
        while True:
            with self._lock:
                connection = self._idle.pop() if self._idle else None
            if connection is None:
                break
            if not _closed_by_server(connection):
                return connection
            self._drop(connection)
        if self._https:
            connection = _OneWriteTLS(self._host, self._port, timeout=self._timeout_s, context=self._tls)
        else:
            connection = _OneWrite(self._host, self._port, timeout=self._timeout_s)
        with self._lock:
            self._open.add(connection)
            self.opened += 1
        return connection

    def _give_back(self, connection: _OneWrite) -> None:
        """Keep ``connection`` idle, or close it when ``MAX_IDLE_CONNECTIONS`` are idle already."""
        with self._lock:
            if len(self._idle) < MAX_IDLE_CONNECTIONS:
                self._idle.append(connection)
                return
        self._drop(connection)

    def _drop(self, connection: _OneWrite) -> None:
        connection.close()
        with self._lock:
            self._open.discard(connection)


def _closed_by_server(connection: _OneWrite) -> bool:
    """Whether an idle kept-alive connection was closed by the server (it reads as ready: end of file).

    A POST is not retried on a failure, since the extender may have acted on it; so a connection the server
    closed while idle (the extender keeps them 120 s, an HTTP server at its defaults far less) must be noticed
    before it is used, as urllib3 does and as Go's transport does (its read loop sees the end of file).
    """
    if connection.sock is None:
        return False  # not connected yet: ``request`` connects
    readable, _, _ = select.select([connection.sock], [], [], 0)
    return bool(readable)
