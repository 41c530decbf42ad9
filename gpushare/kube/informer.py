"""List-then-watch of one resource kind, through the official kubernetes client, feeding a callback.

Objects are delivered as the API server's JSON dicts (``_preload_content=False``): at thousands of nodes
and pods, building the client's model objects costs more than everything else in the cache. A watch that
expires (410 Gone) or breaks is followed by a fresh list, delivered whole through ``on_sync`` so that the
consumer can replace its state rather than patch it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator

import urllib3

from gpushare.kube.api import ListCall, Obj

log = logging.getLogger(__name__)


class Informer:
    """Keeps a consumer in step with one kind of object: ``on_sync`` after each list, ``on_event`` after."""

    def __init__(self, list_call: ListCall, *, on_sync: Callable[[list[Obj]], None],
                 on_event: Callable[[str, Obj], None], kind: str, field_selector: str | None = None,
                 label_selector: str | None = None, watch_timeout_s: int = 300, retry_s: float = 1.0) -> None:
        self._list = list_call
        self._on_sync = on_sync
        self._on_event = on_event
        self.kind = kind
        self._field_selector = field_selector
        self._label_selector = label_selector
        self._watch_timeout_s = watch_timeout_s
        self._retry_s = retry_s
        self._stop = threading.Event()
        self.synced = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: urllib3.BaseHTTPResponse | None = None
        self.relists = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.kind}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            try:
                response.shutdown()  # unblocks the reading thread; close() alone leaves it waiting for data
                response.close()
            except Exception:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                version = self._list_all()
                self.synced.set()
                self._watch(version)
            except Exception as exc:
                if self._stop.is_set():
                    return
                log.warning("watch of %s failed, listing again: %s", self.kind, exc,
                            extra={"kind": self.kind})
                self._stop.wait(self._retry_s)
            self.relists += 1

    def _list_all(self) -> str:
        response = self._list(_preload_content=False, field_selector=self._field_selector,
                              label_selector=self._label_selector)
        body = json.loads(response.data)
        self._on_sync(list(body.get("items") or []))
        return str(body.get("metadata", {}).get("resourceVersion", ""))

    def _watch(self, version: str) -> None:
        while not self._stop.is_set():
            response = self._list(_preload_content=False, watch=True, resource_version=version,
                                  allow_watch_bookmarks=True, timeout_seconds=self._watch_timeout_s,
                                  field_selector=self._field_selector, label_selector=self._label_selector)
            self._response = response
            try:
                if self._stop.is_set():
                    return
                for event in _events(response):
                    kind = event.get("type")
                    obj = event.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            log.info("watch of %s expired (410 Gone), listing again", self.kind)
                            return
                        raise RuntimeError(f"watch error: {obj.get('message')}")
                    version = str(obj.get("metadata", {}).get("resourceVersion", version))
                    if kind != "BOOKMARK":
                        self._on_event(str(kind), obj)
            finally:
                self._response = None
                response.release_conn()


def _events(response: urllib3.BaseHTTPResponse) -> Iterator[Obj]:
    """Split a watch response's body into JSON events, one per line."""
    pending = b""
    for chunk in response.stream(amt=65536, decode_content=True):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                yield json.loads(line)
    if pending.strip():
        yield json.loads(pending)
