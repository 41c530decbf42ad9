"""Registering with the kubelet, and registering again whenever the kubelet restarts.

A restarting kubelet deletes the sockets in its device plugin folder, recreates ``kubelet.sock`` and forgets
every plugin. The folder is watched (inotify through watchfiles): when ``kubelet.sock`` appears, or this
plugin's own socket disappears, the plugin's gRPC server is restarted on a fresh socket and registers again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import grpc
import watchfiles

from gpushare.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from gpushare.kubeletapi import deviceplugin_v1beta1_pb2_grpc as rpc

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
REGISTER_TIMEOUT_S = 5.0
# With no folder event, a failed registration is retried this often (a kubelet that is still starting).
RETRY_MS = 5000


class Registrar:
    def __init__(self, directory: Path, endpoint: str, resource: str, options: pb.DevicePluginOptions,
                 restart_server: Callable[[], None]) -> None:
        self._directory = directory
        self._endpoint = endpoint
        self._resource = resource
        self._options = options
        self._restart_server = restart_server
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.registered = threading.Event()
        self.registrations = 0

    @property
    def kubelet_socket(self) -> Path:
        return self._directory / KUBELET_SOCKET

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="kubelet-registrar", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        if self.kubelet_socket.exists():
            self._register()
        else:
            log.info("Waiting for the kubelet to create %s.", self.kubelet_socket)
        names = {KUBELET_SOCKET, self._endpoint}
        for changes in watchfiles.watch(self._directory, watch_filter=lambda _c, path: Path(path).name in names,
                                        stop_event=self._stop, debounce=100, step=20, rust_timeout=RETRY_MS,
                                        yield_on_timeout=True, raise_interrupt=False):
            self._on_changes(changes)

    def _on_changes(self, changes: set[tuple[watchfiles.Change, str]]) -> None:
        kubelet_there = self.kubelet_socket.exists()
        own_missing = not (self._directory / self._endpoint).exists()
        kubelet_new = any(Path(p).name == KUBELET_SOCKET and c == watchfiles.Change.added for c, p in changes)
        if not kubelet_there:
            if self.registered.is_set():
                log.warning("The kubelet removed %s; registering again once it comes back.", self.kubelet_socket)
            self.registered.clear()
            return
        if kubelet_new or own_missing:
            log.info("The kubelet restarted or the plugin socket vanished; restarting the plugin's socket.")
            self.registered.clear()
            self._restart_server()
            self._register()
        elif not self.registered.is_set():
            self._register()

    def _register(self) -> None:
        request = pb.RegisterRequest(version=API_VERSION, endpoint=self._endpoint, resource_name=self._resource,
                                     options=self._options)
        try:
            with grpc.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
                rpc.RegistrationStub(channel).Register(request, timeout=REGISTER_TIMEOUT_S)
        except grpc.RpcError as exc:
            log.warning("Registering %s with the kubelet at %s failed (%s); retrying when it restarts or in %d s.",
                        self._resource, self.kubelet_socket, exc.details() if hasattr(exc, "details") else exc,
                        RETRY_MS // 1000, extra={"resource": self._resource})
            return
        self.registrations += 1
        self.registered.set()
        log.info("Registered %s with the kubelet at %s.", self._resource, self.kubelet_socket,
                 extra={"resource": self._resource, "endpoint": self._endpoint})
