"""The scheduler loop's client for the extender: kept-alive connections per thread, reopened when the server
closed them, and failures as exceptions the loop turns into kube-scheduler's error sentences."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from gpushare.localcluster.extender_client import ExtenderClient


class Echo(BaseHTTPRequestHandler):
    """Answers a POST with its path and body; ``/close`` answers and then closes the connection, unannounced."""

    protocol_version = "HTTP/1.1"
    connections: ClassVar[set[tuple[str, int]]] = set()
    lock = threading.Lock()

    def do_POST(self) -> None:
        with self.lock:
            self.connections.add(self.client_address)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        answer = self.path.encode() + b" " + body
        self.send_response(200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)
        if self.path.endswith("/close"):
            self.wfile.flush()
            self.close_connection = True

    def log_message(self, *_: object) -> None:
        return None


class Server(ThreadingHTTPServer):
    """Tells when it has closed a connection."""

    closed = threading.Event()

    def shutdown_request(self, request: Any) -> None:
        super().shutdown_request(request)
        self.closed.set()


@pytest.fixture
def server() -> Iterator[str]:
    Echo.connections.clear()
    Server.closed.clear()
    httpd = Server(("127.0.0.1", 0), Echo)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/gpushare-scheduler/"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_thread_keeps_its_connection_and_reopens_one_the_server_closed(server: str) -> None:
    extender = ExtenderClient(server, timeout_s=5)
    try:
        assert extender.post("filter", b"{}") == (200, b"/gpushare-scheduler/filter {}")
        assert extender.post("prioritize", b"[]") == (200, b"/gpushare-scheduler/prioritize []")
        assert len(Echo.connections) == 1
        assert extender.post("close", b"x") == (200, b"/gpushare-scheduler/close x")
        assert Server.closed.wait(5)
        # The server closed it without saying so: the next call notices before sending, and opens another.
        assert extender.post("bind", b"{}") == (200, b"/gpushare-scheduler/bind {}")
        assert len(Echo.connections) == 2
    finally:
        extender.close()


def test_threads_do_not_share_a_connection(server: str) -> None:
    extender = ExtenderClient(server, timeout_s=5)
    barrier = threading.Barrier(4)

    def call(i: int) -> tuple[int, bytes]:
        barrier.wait()
        return extender.post("bind", str(i).encode())

    try:
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(call, range(4)))
        assert answers == [(200, f"/gpushare-scheduler/bind {i}".encode()) for i in range(4)]
        assert len(Echo.connections) == 4
    finally:
        extender.close()


def test_no_answer_is_an_exception_and_a_bad_url_a_sentence(server: str) -> None:
    extender = ExtenderClient("http://127.0.0.1:1/gpushare-scheduler", timeout_s=5)
    with pytest.raises(OSError):
        extender.post("filter", b"{}")
    with pytest.raises(ValueError, match="must be http:// or https://"):
        ExtenderClient("unix:///run/extender.sock", timeout_s=5)
    assert issubclass(http.client.RemoteDisconnected, OSError)  # a dropped answer is caught as an OSError too
