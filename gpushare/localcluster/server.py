"""The HTTP side of the local cluster: a plain ASGI application that speaks the Kubernetes REST API.

It is written against ASGI directly (no web framework) because every bind, list and watch event of a
benchmark goes through it. Handlers run on the event loop one at a time, which is what lets the store be
lock-free; watches are chunked streams of newline-delimited JSON events and never block other requests.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpushare.localcluster import listing
from gpushare.localcluster import resources as kinds
from gpushare.localcluster.errors import (
    ApiError,
    bad_request,
    method_not_allowed,
    not_acceptable,
    qualified,
    too_large_resource_version,
)
from gpushare.localcluster.patch import apply_patch, check_patch_type
from gpushare.localcluster.resources import NAMESPACES, PODS, Obj, Resource
from gpushare.localcluster.selectors import Selector, parse_field_selector, parse_label_selector
from gpushare.localcluster.store import Store, Watcher, event_line
from gpushare.localcluster.tables import COLUMNS, TABLE_CONTENT_TYPE, table

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

KUBERNETES_VERSION = {"major": "1", "minor": "37", "gitVersion": "v1.37.0", "gitCommit": "local",
                      "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "python",
                      "compiler": "gpushare-local-cluster", "platform": "linux/amd64"}
JSON = b"application/json"
DEFAULT_WATCH_TIMEOUT_S = 1800
BOOKMARK_INTERVAL_S = 5.0
LINES_PER_CHUNK = 2000
VERSION_POLL_S = 0.02


def _no_such_path() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


@dataclass
class Response:
    code: int
    body: bytes
    content_type: bytes = JSON


def _json(code: int, obj: Any) -> Response:
    return Response(code, orjson.dumps(obj))


def _success(code: int, details: dict[str, Any] | None = None) -> Obj:
    status: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
    if details is not None:
        status["details"] = details
    if code != 200:
        status["code"] = code
    return status


def _group(group: str, version: str) -> Obj:
    entry = {"groupVersion": f"{group}/{version}", "version": version}
    return {"name": group, "versions": [entry], "preferredVersion": entry}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    accept: str
    content_type: str
    body: bytes

    @classmethod
    def from_scope(cls, scope: Scope, body: bytes) -> Request:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True))
        return cls(scope["method"], scope["path"], query, headers.get("accept", ""), headers.get("content-type", ""),
                   body)

    def json_body(self, required: bool = True) -> Any:
        if not self.body.strip():
            if required:
                raise bad_request(f"the {self.method} request has no body; send a JSON object")
            return None
        media = self.content_type.split(";", 1)[0].strip().lower()
        if self.method != "PATCH" and media not in ("", "application/json", "*/*"):
            raise ApiError(415, "UnsupportedMediaType",
                           f"the body of the request was in an unknown format ({media}) - accepted media types "
                           "include: application/json")
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError as exc:
            raise bad_request(f"the request body is not valid JSON ({exc}); send a JSON object") from None

    @property
    def wants_table(self) -> bool:
        return "as=Table" in self.accept

    def flag(self, name: str) -> bool:
        return self.query.get(name, "").lower() in ("true", "1")


@dataclass(frozen=True)
class Target:
    resource: Resource
    namespace: str | None
    name: str | None
    subresource: str | None


class _ObjectCounts(Collector):
    def __init__(self, store: Store) -> None:
        self._store = store

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("localcluster_objects", "Objects stored in the local cluster, by resource.",
                                   labels=["resource"])
        for resource in self._store.served:
            family.add_metric([qualified(resource.plural, resource.group)], self._store.count(resource))
        yield family


class ApiServer:
    """The ASGI application. ``close()`` ends every open watch so that the HTTP server can stop."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.registry = CollectorRegistry()
        self._requests = Counter("localcluster_requests", "API requests served, by verb, resource and code.",
                                 ["verb", "resource", "code"], registry=self.registry)
        self._watches = Gauge("localcluster_watches", "Open watch streams.", registry=self.registry)
        self.registry.register(_ObjectCounts(store))
        self._closing = False

    def close(self) -> None:
        self._closing = True
        self.store.close_watches()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = Request.from_scope(scope, body)
        verb, resource_name = request.method.lower(), ""
        try:
            target = self._target(request)
            if target is None:
                response = self._static(request)
            else:
                resource_name = target.resource.plural
                verb = self._verb(request, target)
                if verb == "watch":
                    await self._watch(request, target, receive, send)
                    self._requests.labels(verb, resource_name, "200").inc()
                    return
                if verb == "list":
                    await self._wait_for_version(listing.version_floor(request.query))
                response = self._handle(request, target, verb)
        except ApiError as exc:
            response = _json(exc.code, exc.status())
        except Exception as exc:  # the server must outlive any request; the client learns what went wrong
            log.exception("internal error serving %s %s", request.method, request.path,
                          extra={"method": request.method, "path": request.path})
            error = ApiError(500, "InternalError", f"an error on the server ({type(exc).__name__}: {exc}) has "
                             "prevented the request from succeeding; this is a bug in the local cluster")
            response = _json(500, error.status())
        self._requests.labels(verb, resource_name, str(response.code)).inc()
        await send({"type": "http.response.start", "status": response.code,
                    "headers": [(b"content-type", response.content_type),
                                (b"content-length", str(len(response.body)).encode())]})
        await send({"type": "http.response.body", "body": response.body})

    # -- routing -----------------------------------------------------------------------------------------------

    def _target(self, request: Request) -> Target | None:
        """The resource a URL names, or None for the discovery and health endpoints."""
        parts = [p for p in request.path.split("/") if p]
        if len(parts) >= 3 and parts[0] == "api":
            group, version, rest = "", parts[1], parts[2:]
        elif len(parts) >= 4 and parts[0] == "apis":
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            return None
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in NAMESPACES.subresources:
            namespace, rest = rest[1], rest[2:]
        if len(rest) > 3:
            raise _no_such_path()
        if (group, version, rest[0]) == ("", "v1", "bindings") and namespace is not None and len(rest) == 1:
            return Target(PODS, namespace, None, "binding")
        resource = kinds.BY_PATH.get((group, version, rest[0]))
        if resource is None or resource not in self.store.served or (namespace is not None and not resource.namespaced):
            raise _no_such_path()
        if len(rest) > 1 and resource.namespaced and namespace is None:
            raise _no_such_path()
        subresource = rest[2] if len(rest) == 3 else None
        if subresource is not None and subresource not in resource.subresources:
            raise _no_such_path()
        return Target(resource, namespace, rest[1] if len(rest) >= 2 else None, subresource)

    @staticmethod
    def _verb(request: Request, target: Target) -> str:
        method = request.method
        if target.subresource == "binding":
            if method != "POST":
                raise method_not_allowed()
            return "bind"
        if target.name is None:
            verbs = {"GET": "watch" if request.flag("watch") else "list", "POST": "create",
                     "DELETE": "deletecollection"}
        elif target.subresource is not None:
            verbs = {"GET": "get", "PUT": "update", "PATCH": "patch"}
        else:
            verbs = {"GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
        verb = verbs.get(method)
        if verb is None:
            raise method_not_allowed()
        if verb == "create" and target.resource.namespaced and target.namespace is None:
            raise method_not_allowed()
        if verb in ("create", "update", "patch", "delete", "deletecollection", "bind") and request.query.get("dryRun"):
            raise bad_request("the local cluster does not support dry runs; leave out dryRun")
        return verb

    def _static(self, request: Request) -> Response:
        path = "/" + "/".join(p for p in request.path.split("/") if p)
        if request.method != "GET":
            raise method_not_allowed()
        if path in ("/healthz", "/readyz", "/livez"):
            return Response(200, b"ok", b"text/plain; charset=utf-8")
        if path == "/metrics":
            return Response(200, generate_latest(self.registry), b"text/plain; version=0.0.4; charset=utf-8")
        if path == "/version":
            return _json(200, KUBERNETES_VERSION)
        if path == "/api":
            return _json(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []})
        if path == "/api/v1":
            return _json(200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1",
                               "resources": kinds.core_discovery()})
        served_groups = {r.group: r.version for r in self.store.served if r.group}
        if path == "/apis":
            groups = [_group(group, version) for group, version in served_groups.items()]
            return _json(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        for group, version in served_groups.items():
            if path == f"/apis/{group}":
                return _json(200, {"kind": "APIGroup", "apiVersion": "v1", **_group(group, version)})
            if path == f"/apis/{group}/{version}":
                served = tuple(r for r in self.store.served if r.group == group and r.version == version)
                return _json(200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{version}",
                                   "resources": kinds.discovery(served)})
        raise _no_such_path()

    # -- handlers ----------------------------------------------------------------------------------------------

    def _selectors(self, request: Request, resource: Resource) -> tuple[Selector, Selector]:
        return (parse_label_selector(request.query.get("labelSelector")),
                parse_field_selector(request.query.get("fieldSelector"), resource.fields))

    def _handle(self, request: Request, target: Target, verb: str) -> Response:
        store, resource, namespace, name = self.store, target.resource, target.namespace, target.name
        if request.accept and "json" not in request.accept and "*/*" not in request.accept:
            raise not_acceptable(request.accept)
        if verb == "list":
            return self._list(request, target)
        if verb == "create":
            return _json(201, store.create(resource, namespace, request.json_body()))
        if verb == "deletecollection":
            labels, fields = self._selectors(request, resource)
            items = store.delete_collection(resource, namespace, labels, fields)
            return _json(200, {"kind": resource.list_kind, "apiVersion": resource.api_version,
                               "metadata": {"resourceVersion": str(store.version)}, "items": items})
        if verb == "bind":
            store.bind(namespace or "", name, request.json_body())
            return _json(201, _success(201))
        assert name is not None
        if verb == "get":
            obj = store.get(resource, namespace, name)
            if request.wants_table and resource in COLUMNS:
                return self._table(request, resource, [obj])
            return _json(200, obj)
        if verb == "update":
            return _json(200, store.update(resource, namespace, name, request.json_body(), target.subresource))
        if verb == "patch":
            patch_type = check_patch_type(request.content_type)
            patch = request.json_body()
            return _json(200, store.patch(resource, namespace, name, lambda obj: apply_patch(patch_type, obj, patch),
                                          target.subresource))
        deleted = store.delete(resource, namespace, name, request.json_body(required=False))
        if resource in (PODS, NAMESPACES):
            return _json(200, deleted)
        details = {"name": name, "kind": resource.plural, "uid": deleted["metadata"]["uid"]}
        if resource.group:
            details["group"] = resource.group
        return _json(200, _success(200, details))

    def _list(self, request: Request, target: Target) -> Response:
        store, resource = self.store, target.resource
        labels, fields = self._selectors(request, resource)
        wanted = listing.list_request(request.query, store.oldest_retained(resource))
        if wanted.at_least > store.version:
            raise too_large_resource_version(wanted.at_least, store.version)
        version = store.version if wanted.version is None else wanted.version
        page = store.list_page(resource, target.namespace, labels, fields, wanted.version, wanted.limit,
                               wanted.start)
        meta: Obj = {"resourceVersion": str(version)}
        if page.last_key is not None:
            meta["continue"] = listing.encode_continue(version, page.last_key + "\x00")
            if page.remaining is not None:
                meta["remainingItemCount"] = page.remaining
        if request.wants_table and resource in COLUMNS:
            return self._table(request, resource, page.items, meta)
        return Response(200, b'{"kind":"' + resource.list_kind.encode() + b'","apiVersion":"'
                        + resource.api_version.encode() + b'","metadata":' + orjson.dumps(meta) + b',"items":'
                        + orjson.dumps(page.items) + b"}")

    def _table(self, request: Request, resource: Resource, items: list[Obj], meta: Obj | None = None) -> Response:
        include = request.query.get("includeObject", "Metadata")
        if include not in ("None", "Metadata", "Object"):
            raise bad_request(f'includeObject must be None, Metadata or Object, not "{include}"')
        rendered = table(resource, items, str(self.store.version), include)
        if meta is not None:
            rendered["metadata"] = meta
        return Response(200, orjson.dumps(rendered), TABLE_CONTENT_TYPE)

    async def _wait_for_version(self, version: int) -> None:
        """Give writes in flight up to the watch cache's 3 s to reach ``version``; the caller checks the outcome."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + listing.TOO_LARGE_WAIT_S
        while self.store.version < version and loop.time() < deadline and not self._closing:
            await asyncio.sleep(VERSION_POLL_S)

    async def _watch(self, request: Request, target: Target, receive: Receive, send: Send) -> None:
        resource = target.resource
        labels, fields = self._selectors(request, resource)
        timeout_text = request.query.get("timeoutSeconds", "")
        try:
            timeout_s = float(timeout_text) if timeout_text else DEFAULT_WATCH_TIMEOUT_S
        except ValueError:
            raise bad_request(f'timeoutSeconds "{timeout_text}" is not a number of seconds') from None
        bookmarks = request.flag("allowWatchBookmarks")
        wanted = listing.watch_request(request.query)
        if wanted.at_least > self.store.version:
            await self._wait_for_version(wanted.at_least)
            if wanted.at_least > self.store.version:
                raise too_large_resource_version(wanted.at_least, self.store.version)
        wake = asyncio.Event()
        render = _table_events(resource) if request.wants_table and resource in COLUMNS else None
        watcher = self.store.watch(resource, target.namespace, labels, fields, wanted.version, wake.set, render,
                                   wanted.initial_events)
        if wanted.initial_events and bookmarks and render is None:
            end = self.store.bookmark(watcher, initial_events_end=True)
            if end is not None:
                watcher.pending.append(end)
        if self._closing:
            watcher.close()
        self._watches.inc()
        disconnected = asyncio.Event()

        async def wait_for_disconnect() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected.set()
            wake.set()

        listener = asyncio.ensure_future(wait_for_disconnect())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", JSON), (b"cache-control", b"no-cache, private")]})
            await self._stream(watcher, resource, bookmarks, deadline, wake, disconnected, send)
        except Exception:  # the response has started: all that is left is to end it and log why
            log.exception("watch stream failed", extra={"resource": resource.plural})
        finally:
            listener.cancel()
            self.store.unwatch(watcher)
            self._watches.dec()

    async def _stream(self, watcher: Watcher, resource: Resource, bookmarks: bool, deadline: float,
                      wake: asyncio.Event, disconnected: asyncio.Event, send: Send) -> None:
        loop = asyncio.get_running_loop()
        while not disconnected.is_set():
            lines = watcher.take(LINES_PER_CHUNK)
            if lines:
                await send({"type": "http.response.body", "body": b"".join(lines), "more_body": True})
                continue
            if watcher.closed:
                break
            remaining = deadline - loop.time()
            if remaining <= 0:
                # Like the API server: the client can resume from the last bookmark without a relist.
                last = self.store.bookmark(watcher) if bookmarks else None
                if last is not None:
                    await send({"type": "http.response.body", "body": last, "more_body": True})
                break
            wake.clear()
            try:
                await asyncio.wait_for(wake.wait(), min(remaining, BOOKMARK_INTERVAL_S))
            except TimeoutError:
                if bookmarks and not watcher.pending and loop.time() < deadline:
                    mark = self.store.bookmark(watcher)
                    if mark is not None:
                        watcher.pending.append(mark)
        if not disconnected.is_set():
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def _table_events(resource: Resource) -> Callable[[str, Obj], bytes]:
    """Watch events whose objects are one-row Tables, for ``kubectl get --watch``."""

    def render(type_: str, obj: Obj) -> bytes:
        return event_line(type_, table(resource, [obj], obj["metadata"]["resourceVersion"]))

    return render
