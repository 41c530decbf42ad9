"""List-then-watch of one resource kind, through the official kubernetes client, feeding a callback.

Objects are delivered as the API server's JSON dicts (``_preload_content=False``): at thousands of nodes
and pods, building the client's model objects costs more than everything else in the cache. The list is read
in pages of ``PAGE_SIZE`` (``limit``/``continue``), so no reply holds every pod of a large cluster at once. A
watch that expires (410 Gone) or breaks is followed by a fresh list, delivered through ``on_sync`` so that the
consumer can replace its state rather than patch it: whole (``list``) by default, or, with ``streamed=True``,
as an iterator that fetches each page when the consumer reaches it, so that only one page of raw objects is
alive at a time. A continue token that has expired (410 while paging: the snapshot left etcd's history) starts
the list over; a streamed consumer then sees its iterator raise ``ListRestarted`` and is called again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, Literal, overload

import orjson
import urllib3
from kubernetes.client.exceptions import ApiException

from gpushare.kube.api import ListCall, Obj

log = logging.getLogger(__name__)

# client-go's pager asks for 500 objects per page (k8s.io/client-go/tools/pager, defaultPageSize), as do
# kube-scheduler's and the kubelet's informers: one page of real pods is a few MB of JSON.
PAGE_SIZE = 500


class ListRestarted(Exception):
    """The list's continue token expired before its last page: the informer lists again from the start."""


class Informer:
    """Keeps a consumer in step with one kind of object: ``on_sync`` after each list, ``on_event`` after."""

    @overload
    def __init__(self, list_call: ListCall, *, on_sync: Callable[[list[Obj]], None],
                 on_event: Callable[[str, Obj], None], kind: str, field_selector: str | None = None,
                 label_selector: str | None = None, watch_timeout_s: int = 300, retry_s: float = 1.0,
                 page_size: int = PAGE_SIZE, streamed: Literal[False] = False) -> None: ...

    @overload
    def __init__(self, list_call: ListCall, *, on_sync: Callable[[Iterator[Obj]], None],
                 on_event: Callable[[str, Obj], None], kind: str, field_selector: str | None = None,
                 label_selector: str | None = None, watch_timeout_s: int = 300, retry_s: float = 1.0,
                 page_size: int = PAGE_SIZE, streamed: Literal[True]) -> None: ...

    def __init__(self, list_call: ListCall, *, on_sync: Callable[[Any], None],
                 on_event: Callable[[str, Obj], None], kind: str, field_selector: str | None = None,
                 label_selector: str | None = None, watch_timeout_s: int = 300, retry_s: float = 1.0,
                 page_size: int = PAGE_SIZE, streamed: bool = False) -> None:
        self._list = list_call
        self._on_sync = on_sync
        self._on_event = on_event
        self.kind = kind
        self._field_selector = field_selector
        self._label_selector = label_selector
        self._watch_timeout_s = watch_timeout_s
        self._retry_s = retry_s
        self._page_size = page_size
        self._streamed = streamed
        self._stop = threading.Event()
        self.synced = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: urllib3.BaseHTTPResponse | None = None
        self.relists = 0
        self.list_restarts = 0

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
        """List every object, page by page, into ``on_sync``; the resourceVersion to watch from."""
        while True:
            listing = _PagedList(self._list, self.kind, self._page_size, field_selector=self._field_selector,
                                 label_selector=self._label_selector)
            try:
                if self._streamed:
                    self._on_sync(listing.items())
                    # A consumer that stopped early still needs the snapshot's version to watch from.
                    for _ in listing.items():
                        pass
                else:
                    self._on_sync(list(listing.items()))
                return listing.version
            except ListRestarted:
                self.list_restarts += 1
                log.info("the list of %s took longer than the API server keeps its snapshot (410 Expired), "
                         "listing again from the start", self.kind, extra={"kind": self.kind})

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
                yield orjson.loads(line)
    if pending.strip():
        yield orjson.loads(pending)


class _PagedList:
    """One list in pages of one snapshot; ``items`` yields them, fetching each page when the previous is used up."""

    def __init__(self, list_call: ListCall, kind: str, page_size: int, **selectors: str | None) -> None:
        self._list = list_call
        self._kind = kind
        self._page_size = page_size
        self._selectors = selectors
        self._token: str | None = ""  # "" before the first page, None after the last
        self.version = ""

    def items(self) -> Iterator[Obj]:
        while self._token is not None:
            yield from self._page()

    def _page(self) -> list[Obj]:
        options: dict[str, Any] = {"limit": self._page_size, **self._selectors}
        if self._token:
            options["_continue"] = self._token
        try:
            response = self._list(_preload_content=False, **options)
        except ApiException as exc:
            if exc.status == 410 and self._token:
                raise ListRestarted(f"the continue token of the {self._kind} list expired") from None
            raise
        body = orjson.loads(response.data)
        metadata = body.get("metadata") or {}
        self.version = str(metadata.get("resourceVersion", ""))
        self._token = metadata.get("continue") or None
        return list(body.get("items") or [])
