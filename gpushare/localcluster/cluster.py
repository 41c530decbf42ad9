"""``LocalCluster``: the local API server on a background thread, loaded from a cluster description.

For tests and the demo only. It keeps everything in memory and has no authentication, no controllers and of
the admission plugins only Priority; it is never a stand-in for a real cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import uvicorn
import yaml
from kubernetes import client

from gpushare.clusterspec import ClusterSpec
from gpushare.localcluster.errors import ApiError
from gpushare.localcluster.nodes import node_object
from gpushare.localcluster.resources import CRDS, NODES, Resource
from gpushare.localcluster.server import ApiServer
from gpushare.localcluster.store import Store

log = logging.getLogger(__name__)

CONTEXT = "local"
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


class _Server(uvicorn.Server):
    """uvicorn's server, woken by ``stop()`` at once rather than noticing ``should_exit`` on its next tick."""

    stopping: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self.stopping = asyncio.Event()
        if not self.should_exit:
            await self.stopping.wait()

    def wake(self) -> None:
        if self.stopping is not None:
            self.stopping.set()


class LocalCluster:
    """A Kubernetes API server in this process::

        with LocalCluster(spec) as cluster:
            core = kubernetes.client.CoreV1Api(cluster.api_client())
    """

    def __init__(self, spec: ClusterSpec | None = None, publish_inventory: bool = True, host: str = "127.0.0.1",
                 port: int = 0, event_window: int = 1000, crds: tuple[Resource, ...] = CRDS) -> None:
        self.spec = spec or ClusterSpec()
        self.crds = crds
        """Custom resources the API server serves besides the built-in kinds (``resources.CRDS``), as if installed."""
        self.publish_inventory = publish_inventory
        self.host = host
        self.port = port
        self.event_window = event_window
        self._server: _Server | None = None
        self._app: ApiServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._clients: list[Any] = []

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("The local cluster is not running; call start() or use it as a context manager.")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> LocalCluster:
        if self._server is not None:
            raise RuntimeError("The local cluster is already running; stop() it before starting it again.")
        store = Store(self.event_window, self.crds)
        for ordinal, node in enumerate(self.spec.nodes):
            try:
                store.create(NODES, None, node_object(node, ordinal, self.publish_inventory))
            except ApiError as exc:
                raise ValueError(f"The cluster description cannot be loaded: {exc.message}; fix node {node.name!r} "
                                 "(node names must be unique).") from None
        self._app = ApiServer(store)
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # IPPROTO_TCP spelled out: asyncio turns Nagle off only on sockets that say so, and with Nagle on, a
        # response written as headers then body waits for the client's delayed ACK (40 ms a request).
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise RuntimeError(f"Cannot listen on {self.host}:{self.port} ({exc.strerror}); choose another port, "
                               "or port 0 for any free one.") from None
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self._app, host=self.host, port=self.port, lifespan="off", log_config=None,
                                access_log=False, interface="asgi3", http="httptools", proxy_headers=False,
                                server_header=False, date_header=False, timeout_keep_alive=120,
                                timeout_graceful_shutdown=5)
        self._server = _Server(config)
        self._thread = threading.Thread(target=self._run, args=(sock,), name="local-apiserver", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("The local API server did not start; see the log above for the reason.")
            time.sleep(0.005)
        log.info("local cluster serving", extra={"url": self.url, "nodes": len(self.spec.nodes)})
        return self

    def _run(self, sock: socket.socket) -> None:
        asyncio.run(self._serve(sock))

    async def _serve(self, sock: socket.socket) -> None:
        assert self._server is not None
        self._loop = asyncio.get_running_loop()
        await self._server.serve(sockets=[sock])

    def stop(self) -> None:
        """End every watch and connection and join the server thread; safe to call twice."""
        server, app, loop, thread = self._server, self._app, self._loop, self._thread
        if server is None:
            return
        server.should_exit = True
        if app is not None and loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already finished
                loop.call_soon_threadsafe(app.close)
                loop.call_soon_threadsafe(server.wake)
        if thread is not None:
            thread.join(timeout=STOP_TIMEOUT_S)
            if thread.is_alive():
                log.warning("local API server thread did not stop in time", extra={"timeout_s": STOP_TIMEOUT_S})
        for api in self._clients:
            api.close()
        self._clients.clear()
        self._server = self._app = self._loop = self._thread = None

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def kubeconfig(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": CONTEXT, "cluster": {"server": self.url}}],
            "users": [{"name": CONTEXT, "user": {}}],
            "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": CONTEXT, "namespace": "default"}}],
            "current-context": CONTEXT,
        }

    def write_kubeconfig(self, path: str | Path) -> Path:
        """Write a kubeconfig for this cluster (plain HTTP, no credentials) that kubectl and clients accept."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(yaml.safe_dump(self.kubeconfig(), sort_keys=False))
        return target

    def api_client(self) -> client.ApiClient:
        """A ``kubernetes.client.ApiClient`` for this cluster; closed when the cluster stops."""
        configuration = client.Configuration(host=self.url)
        api = client.ApiClient(configuration)
        self._clients.append(api)
        return api
