"""The scheduler loop's client for the extender: kept-alive connections pooled as Go's client pools them (two idle
at most), reopened when the server closed them, and failures as exceptions the loop turns into kube-scheduler's
error sentences."""

from __future__ import annotations

import http.client
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from gpushare.localcluster.extender_client import ExtenderClient


class Echo(BaseHTTPRequestHandler):
    """Answers a POST with its path and body; ``/close`` answers and then closes the connection, unannounced. With a
    ``gate``, no request is answered before the gate's number of them have arrived."""

    protocol_version = "HTTP/1.1"
    connections: ClassVar[set[tuple[str, int]]] = set()
    lock = threading.Lock()
    gate: ClassVar[threading.Barrier | None] = None

    def do_POST(self) -> None:
        with self.lock:
            self.connections.add(self.client_address)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.gate is not None:
            self.gate.wait(timeout=5)
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
    """Tells when it has closed a connection, and counts them."""

    closed = threading.Event()
    closes = 0

    def shutdown_request(self, request: Any) -> None:
        super().shutdown_request(request)
        with Echo.lock:
            Server.closes += 1
        self.closed.set()


@pytest.fixture
def server() -> Iterator[str]:
    Echo.connections.clear()
    Echo.gate = None
    Server.closed.clear()
    Server.closes = 0
    httpd = Server(("127.0.0.1", 0), Echo)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/gpushare-scheduler/"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_calls_one_after_another_keep_one_connection_and_reopen_one_the_server_closed(server: str) -> None:
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
        assert extender.opened == 2
    finally:
        extender.close()


def test_calls_in_flight_together_each_have_a_connection_and_two_stay_open_after(server: str) -> None:
    """As kube-scheduler's Go client: binds in flight beside a filter open connections, and all but two idle ones
    are closed as they come back, so the extender accepts a connection for each call past two in flight."""
    extender = ExtenderClient(server, timeout_s=5)
    # The server answers none of the four before all four arrived: each is in flight while the others are sent
    # (else a call that came back first could lend its connection to one sent after it, on a busy machine).
    Echo.gate = threading.Barrier(4)

    def call(i: int) -> tuple[int, bytes]:
        return extender.post("bind", str(i).encode())

    try:
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(call, range(4)))
        Echo.gate = None
        assert answers == [(200, f"/gpushare-scheduler/bind {i}".encode()) for i in range(4)]
        assert len(Echo.connections) == extender.opened == 4
        deadline = time.monotonic() + 5
        while Server.closes < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert Server.closes == 2
        # The two kept serve the next calls, one after another: no connection is opened for them.
        for verb in ("filter", "bind", "filter"):
            assert extender.post(verb, b"{}")[0] == 200
        assert len(Echo.connections) == extender.opened == 4
        assert Server.closes == 2
    finally:
        extender.close()


def test_no_answer_is_an_exception_and_a_bad_url_a_sentence(server: str) -> None:
    extender = ExtenderClient("http://127.0.0.1:1/gpushare-scheduler", timeout_s=5)
    with pytest.raises(OSError):
        extender.post("filter", b"{}")
    with pytest.raises(ValueError, match="must be http:// or https://"):
        ExtenderClient("unix:///run/extender.sock", timeout_s=5)
    assert issubclass(http.client.RemoteDisconnected, OSError)  # a dropped answer is caught as an OSError too


# Answers one POST with the milliseconds between the end of its head and the end of its body, as they arrived.
_TIMING_SERVER = r"""
import socket, time
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
data = b""
while b"\r\n\r\n" not in data:
    data += conn.recv(65536)
head_done = time.monotonic()
head, _, body = data.partition(b"\r\n\r\n")
length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
while len(body) < length:
    body += conn.recv(65536)
gap = f"{(time.monotonic() - head_done) * 1000:.1f}".encode()
conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(gap), gap))
conn.close()
"""


def test_a_request_goes_out_in_one_write_even_when_the_caller_waits_for_the_gil() -> None:
    """Written in two, the body of a request would follow its head only once the calling thread had the GIL back,
    here a tenth of a second later behind a busy thread; the extender would wait for it with the head in hand."""
    server = subprocess.Popen([sys.executable, "-c", _TIMING_SERVER], stdout=subprocess.PIPE, text=True)
    busy = threading.Event()

    def spin() -> None:
        while not busy.is_set():
            pass

    interval = sys.getswitchinterval()
    spinner = threading.Thread(target=spin)
    try:
        assert server.stdout is not None
        extender = ExtenderClient(f"http://127.0.0.1:{int(server.stdout.readline())}", timeout_s=5)
        sys.setswitchinterval(0.1)
        spinner.start()
        try:
            # 2 kB: any socket's send buffer takes it in one call, so only the head and body split could delay it.
            status, gap = extender.post("filter", b'{"NodeNames": [' + b'"node-0001",' * 150 + b'"node-0002"]}')
        finally:
            extender.close()
        assert status == 200
        assert float(gap) < 50, f"the body arrived {gap.decode()} ms after the head"
    finally:
        busy.set()
        sys.setswitchinterval(interval)
        if spinner.is_alive():
            spinner.join()
        server.kill()
        server.wait()
