"""The in-memory object store behind the local API server: objects, resource versions, history and watchers.

Every method runs on the server's event loop thread, one at a time, so the store needs no locks and a watch
registered in the middle of a burst of writes sees every later event exactly once.

Stored objects are never modified in place. A write builds a new dictionary (sharing untouched parts with
the previous version), which lets responses and watch events hand out stored objects without copying them.

Watch semantics follow the API server's watch cache: each kind keeps a window of its recent changes; a watch
from a resource version older than the window ends with an ERROR event (410, reason ``Expired``); with a
selector, an object that starts matching arrives as ADDED, and one that stops matching as DELETED carrying
its previous content and the new resource version.
"""

from __future__ import annotations

import bisect
import random
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, NamedTuple

import orjson

from gpushare.localcluster import resources as kinds
from gpushare.localcluster.errors import (
    STALE,
    already_exists,
    bad_request,
    conflict,
    expired,
    invalid,
    method_not_allowed,
    not_found,
)
from gpushare.localcluster.priority import system_classes
from gpushare.localcluster.resources import NAMESPACES, PODS, Obj, Resource
from gpushare.localcluster.selectors import Selector

Key = tuple[str, str]

# Watchers that pin one of these fields with "=" are indexed by its value, so that thousands of per-node
# watches (kubelets) cost nothing on events for other nodes.
INDEXED_FIELDS = ("spec.nodeName", "metadata.name")
# A watcher that falls this far behind is closed; its client watches again (and relists if it must).
MAX_PENDING_EVENTS = 200_000
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
_GENERATED_CHARS = "bcdfghjklmnpqrstvwxz2456789"


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _with_version(obj: Obj, version: int) -> Obj:
    return {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(version)}}


class Change:
    """One write to one object, as kept in the history and sent to watchers."""

    __slots__ = ("_lines", "obj", "prev", "type", "version")

    def __init__(self, version: int, type_: str, obj: Obj, prev: Obj | None) -> None:
        self.version = version
        self.type = type_
        self.obj = obj
        self.prev = prev
        self._lines: dict[str, bytes] = {}

    def object_for(self, type_: str) -> Obj:
        """What a watcher sees: a MODIFIED object that left its selector is DELETED with its previous content."""
        if type_ == "DELETED" and self.type == "MODIFIED":
            assert self.prev is not None
            return _with_version(self.prev, self.version)
        return self.obj

    def line(self, type_: str) -> bytes:
        """The watch event as one line of JSON, serialized once however many watchers receive it."""
        cached = self._lines.get(type_)
        if cached is None:
            cached = event_line(type_, self.object_for(type_))
            self._lines[type_] = cached
        return cached


def event_line(type_: str, obj: Obj) -> bytes:
    return b'{"type":"' + type_.encode() + b'","object":' + orjson.dumps(obj) + b"}\n"


Render = Callable[[str, Obj], bytes]


class Watcher:
    """One open watch: which objects it wants, and the event lines not yet sent."""

    def __init__(self, resource: Resource, namespace: str | None, labels: Selector, fields: Selector,
                 wake: Callable[[], None], render: Render | None = None) -> None:
        self.resource = resource
        self.render = render
        self.namespace = namespace
        self.labels = labels
        self.fields = fields
        self.wake = wake
        self.pending: list[bytes] = []
        self.closed = False
        self.since = 0
        self.index_key = next(((f, v) for f in INDEXED_FIELDS if (v := fields.equals(f)) is not None), None)

    def matches(self, obj: Obj) -> bool:
        meta = obj["metadata"]
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        if self.labels and not self.labels.matches((meta.get("labels") or {}).get):
            return False
        return not self.fields or self.fields.matches(lambda f: self.resource.fields[f](obj))

    def offer(self, change: Change) -> None:
        if change.version <= self.since:  # a watch from a version still to come starts when it arrives
            return
        now = change.type != "DELETED" and self.matches(change.obj)
        before = self.matches(change.prev if change.prev is not None else change.obj) if (
            change.type != "ADDED") else False
        type_ = ("MODIFIED" if before else "ADDED") if now else ("DELETED" if before else None)
        if type_ is not None:
            self.push(change.line(type_) if self.render is None else self.render(type_, change.object_for(type_)))

    def push(self, line: bytes) -> None:
        if self.closed:
            return
        if len(self.pending) >= MAX_PENDING_EVENTS:
            self.close()
            return
        self.pending.append(line)
        self.wake()

    def take(self, limit: int) -> list[bytes]:
        lines, self.pending = self.pending[:limit], self.pending[limit:]
        return lines

    def close(self) -> None:
        self.closed = True
        self.wake()


class Collection:
    """The objects of one kind, its recent history and its watchers."""

    def __init__(self, resource: Resource, window: int, version: int) -> None:
        self.resource = resource
        self.objects: dict[Key, Obj] = {}
        self.history: deque[Change] = deque(maxlen=window)
        self.history_start = version  # every change after this version is in ``history``
        self.watchers: set[Watcher] = set()
        self.unindexed: set[Watcher] = set()
        self.indexed: dict[tuple[str, str], set[Watcher]] = {}
        self.indexed_fields = tuple(f for f in INDEXED_FIELDS if f in resource.fields)

    def record(self, change: Change) -> None:
        if self.history.maxlen and len(self.history) == self.history.maxlen:
            self.history_start = self.history[0].version
        self.history.append(change)
        for watcher in self._interested(change):
            watcher.offer(change)

    def _interested(self, change: Change) -> Iterable[Watcher]:
        if not self.indexed:
            return list(self.unindexed)
        out = set(self.unindexed)
        for obj in (change.obj, change.prev):
            if obj is not None:
                for f in self.indexed_fields:
                    out.update(self.indexed.get((f, self.resource.fields[f](obj)), ()))
        return out

    def add_watcher(self, watcher: Watcher) -> None:
        self.watchers.add(watcher)
        if watcher.index_key is None:
            self.unindexed.add(watcher)
        else:
            self.indexed.setdefault(watcher.index_key, set()).add(watcher)

    def remove_watcher(self, watcher: Watcher) -> None:
        self.watchers.discard(watcher)
        self.unindexed.discard(watcher)
        if watcher.index_key is not None:
            group = self.indexed.get(watcher.index_key)
            if group is not None:
                group.discard(watcher)
                if not group:
                    del self.indexed[watcher.index_key]


class Page(NamedTuple):
    items: list[Obj]
    last_key: str | None  # the storage key of the last item, when more may follow
    remaining: int | None  # how many objects follow, when the list has no selector


def _storage_key(key: Key) -> str:
    """How etcd orders a kind's objects: by ``namespace/name`` (or ``name``), byte by byte."""
    return f"{key[0]}/{key[1]}" if key[0] else key[1]


def parse_version(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise bad_request(f'resourceVersion "{text}" is not a resource version; use one returned by a list, a get '
                          "or a watch event")
    return value


class Store:
    def __init__(self, event_window: int = 1000, crds: tuple[Resource, ...] = ()) -> None:
        if event_window < 1:
            raise ValueError("event_window must be at least 1: it is how many changes per kind a watch can resume "
                             "from.")
        self.version = 1
        self.served = kinds.RESOURCES + crds
        """The kinds this cluster serves: the built-in ones and the custom resources it was started with."""
        self._collections = {r: Collection(r, event_window, self.version) for r in self.served}
        for name in kinds.INITIAL_NAMESPACES:
            self.create(NAMESPACES, None, {"metadata": {"name": name}})
        for pc in system_classes():
            self.create(kinds.PRIORITY_CLASSES, None, pc)

    # -- reads -------------------------------------------------------------------------------------------------

    def get(self, resource: Resource, namespace: str | None, name: str) -> Obj:
        obj = self._collections[resource].objects.get((namespace or "", name))
        if obj is None:
            raise not_found(resource.plural, resource.group, name)
        return obj

    def list_objects(self, resource: Resource, namespace: str | None, labels: Selector, fields: Selector) -> list[Obj]:
        return self.list_page(resource, namespace, labels, fields).items

    def list_page(self, resource: Resource, namespace: str | None, labels: Selector, fields: Selector,
                  version: int | None = None, limit: int = 0, start: str = "") -> Page:
        """Matching objects in storage-key order (``namespace/name``), as of ``version`` (None: the latest).

        With a ``limit``, at most that many, from the storage key ``start`` on; the page says where the next
        one starts and, without selectors, how many objects remain (as etcd's paged lists do).
        """
        probe = Watcher(resource, namespace, labels, fields, lambda: None)
        objects = self._collections[resource].objects if version is None else self._snapshot(resource, version)
        keys = sorted(_storage_key(k) for k in objects if namespace is None or k[0] == namespace)
        if start:
            keys = keys[bisect.bisect_left(keys, start):]
        by_key = {_storage_key(k): obj for k, obj in objects.items()}
        items: list[Obj] = []
        for i, key in enumerate(keys):
            obj = by_key[key]
            if probe.matches(obj):
                items.append(obj)
                if limit and len(items) == limit:
                    rest = len(keys) - i - 1
                    if rest:
                        return Page(items, key, None if labels or fields else rest)
                    break
        return Page(items, None, None)

    def _snapshot(self, resource: Resource, version: int) -> dict[Key, Obj]:
        """The objects of a kind as they were at ``version``, rebuilt by undoing the changes made since."""
        collection = self._collections[resource]
        if version < collection.history_start:
            raise expired("The resourceVersion for the provided list is too old.")
        objects = dict(collection.objects)
        for change in reversed(collection.history):
            if change.version <= version:
                break
            meta = change.obj["metadata"]
            key = (meta.get("namespace", ""), meta["name"])
            if change.type == "ADDED":
                del objects[key]
            else:
                assert change.prev is not None
                objects[key] = change.prev
        return objects

    def oldest_retained(self, resource: Resource) -> int:
        """The oldest version the kind's history can rebuild a snapshot at (or a watch resume from)."""
        return self._collections[resource].history_start

    def count(self, resource: Resource) -> int:
        return len(self._collections[resource].objects)

    # -- writes ------------------------------------------------------------------------------------------------

    def _commit(self, resource: Resource, type_: str, obj: Obj, prev: Obj | None) -> Obj:
        self.version += 1
        obj = _with_version(obj, self.version)
        meta = obj["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        collection = self._collections[resource]
        if type_ == "DELETED":
            del collection.objects[key]
        else:
            collection.objects[key] = obj
        collection.record(Change(self.version, type_, obj, prev))
        return obj

    def _check_namespace(self, resource: Resource, namespace: str | None) -> str:
        if not resource.namespaced:
            return ""
        assert namespace is not None
        if ("", namespace) not in self._collections[NAMESPACES].objects:
            raise not_found("namespaces", "", namespace)
        return namespace

    def _body_metadata(self, resource: Resource, namespace: str | None, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise bad_request(f"the request body must be a JSON object describing a {resource.kind}")
        kinds.check_kind(resource, body)
        meta = body.get("metadata")
        if meta is None:
            meta = {}
        if not isinstance(meta, dict):
            raise bad_request("metadata must be a JSON object")
        if resource.namespaced and meta.get("namespace") not in (None, "", namespace):
            raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
        return dict(meta)

    def create(self, resource: Resource, namespace: str | None, body: Any) -> Obj:
        meta = self._body_metadata(resource, namespace, body)
        namespace = self._check_namespace(resource, namespace)
        objects = self._collections[resource].objects
        name = meta.get("name")
        if not name:
            prefix = meta.get("generateName")
            if not prefix or not isinstance(prefix, str):
                raise invalid(resource.kind, resource.group, "", "metadata.name",
                              "Required value: name or generateName is required")
            for _ in range(8):
                name = prefix + "".join(random.choices(_GENERATED_CHARS, k=5))
                if (namespace, name) not in objects:
                    break
        if not isinstance(name, str):
            raise invalid(resource.kind, resource.group, str(name), "metadata.name", "Invalid value: must be a string")
        kinds.check_name(resource, name)
        if (namespace, name) in objects:
            raise already_exists(resource.plural, resource.group, name)
        for system in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields"):
            meta.pop(system, None)
        meta.update(name=name, uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339())
        if resource.namespaced:
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        obj = {**body, "apiVersion": resource.api_version, "kind": resource.kind, "metadata": meta}
        kinds.decode(resource, obj)
        kinds.apply_defaults(resource, obj)
        kinds.prepare_create(resource, obj)
        kinds.admit(resource, obj, lambda: list(self._collections[kinds.PRIORITY_CLASSES].objects.values()))
        kinds.validate(resource, obj)
        return self._commit(resource, "ADDED", obj, None)

    def update(self, resource: Resource, namespace: str | None, name: str, body: Any,
               subresource: str | None = None) -> Obj:
        meta = self._body_metadata(resource, namespace, body)
        old = self.get(resource, namespace, name)
        if meta.get("name", name) != name:
            raise bad_request(f"the name of the object ({meta.get('name')}) does not match the name on the URL "
                              f"({name})")
        old_meta = old["metadata"]
        version = meta.get("resourceVersion")
        if version and version != old_meta["resourceVersion"]:
            raise conflict(resource.plural, resource.group, name, STALE)
        if meta.get("uid") and meta["uid"] != old_meta["uid"]:
            raise conflict(resource.plural, resource.group, name,
                           f"Precondition failed: UID in precondition: {meta['uid']}, UID in object meta: "
                           f"{old_meta['uid']}")
        meta.pop("managedFields", None)
        for system in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp", "resourceVersion",
                       "generation"):
            if system in old_meta:
                meta[system] = old_meta[system]
            else:
                meta.pop(system, None)
        new = {**body, "apiVersion": resource.api_version, "kind": resource.kind, "metadata": meta}
        kinds.decode(resource, new)
        kinds.apply_defaults(resource, new)
        self._keep_other_half(resource, old, new, subresource)
        kinds.validate(resource, new)
        kinds.validate_update(resource, old, new)
        if new == old:
            return old
        return self._commit(resource, "MODIFIED", new, old)

    @staticmethod
    def _keep_other_half(resource: Resource, old: Obj, new: Obj, subresource: str | None) -> None:
        """The main resource cannot change status, and ``/status`` can change nothing but status and metadata."""
        if subresource == "status":
            keep = ("spec",)
            if resource is PODS and "ownerReferences" in old["metadata"]:
                new["metadata"]["ownerReferences"] = old["metadata"]["ownerReferences"]
        elif resource.has_status:
            keep = ("status",)
        else:
            return
        for part in keep:
            if part in old:
                new[part] = old[part]
            else:
                new.pop(part, None)

    def patch(self, resource: Resource, namespace: str | None, name: str, patched: Callable[[Obj], Obj],
              subresource: str | None = None) -> Obj:
        """Apply ``patched`` (one of the patch functions) to the current object and store it as an update.

        A resourceVersion in the patch is a precondition, as with an update; without one the patch always
        applies to the latest version.
        """
        old = self.get(resource, namespace, name)
        new = patched(old)
        meta = new.get("metadata")
        if isinstance(meta, dict) and "resourceVersion" not in meta:
            new = {**new, "metadata": {**meta, "resourceVersion": old["metadata"]["resourceVersion"]}}
        return self.update(resource, namespace, name, new, subresource)

    def delete(self, resource: Resource, namespace: str | None, name: str, options: Any = None) -> Obj:
        old = self.get(resource, namespace, name)
        kinds.check_deletable(resource, name)
        preconditions = options.get("preconditions") if isinstance(options, dict) else None
        if isinstance(preconditions, dict):
            for field, key in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
                wanted = preconditions.get(field)
                if wanted and wanted != old["metadata"][field]:
                    raise conflict(resource.plural, resource.group, name,
                                   f"Precondition failed: {key} in precondition: {wanted}, {key} in object meta: "
                                   f"{old['metadata'][field]}")
        if resource is NAMESPACES:
            for collection in self._collections.values():
                if collection.resource.namespaced:
                    for contained in [k for k in collection.objects if k[0] == name]:
                        gone = collection.objects[contained]
                        self._commit(collection.resource, "DELETED", gone, gone)
        return self._commit(resource, "DELETED", old, old)

    def delete_collection(self, resource: Resource, namespace: str | None, labels: Selector,
                          fields: Selector) -> list[Obj]:
        if resource is NAMESPACES:
            raise method_not_allowed()
        return [self.delete(resource, namespace, obj["metadata"]["name"])
                for obj in self.list_objects(resource, namespace, labels, fields)]

    def bind(self, namespace: str, name: str | None, body: Any) -> None:
        """Assign a pod to a node, as ``pods/binding`` does: once, and copying the Binding's annotations."""
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object describing a Binding")
        if body.get("kind") not in (None, "", "Binding"):
            raise bad_request(f"the body is a {body.get('kind')}, but this URL takes a Binding")
        meta = body.get("metadata") or {}
        target = body.get("target") or {}
        if not isinstance(meta, dict) or not isinstance(target, dict):
            raise bad_request("metadata and target of a Binding must be JSON objects")
        pod_name = meta.get("name") or name
        if name is not None and pod_name != name:
            raise bad_request(f"name in URL ({name}) does not match name in Binding object ({pod_name})")
        if not pod_name:
            raise invalid("Binding", "", "", "metadata.name", "Required value: the name of the pod to bind")
        if not target.get("name"):
            raise invalid("Binding", "", pod_name, "target.name", "Required value: the name of the node")
        if target.get("kind") not in (None, "", "Node"):
            raise invalid("Binding", "", pod_name, "target.kind",
                          f'Unsupported value: "{target.get("kind")}": supported values: "Node", ""')
        pod = self.get(PODS, namespace, pod_name)
        pod_meta = pod["metadata"]
        # The Binding's uid and resourceVersion are preconditions, checked before anything else, as the real
        # server's storage update checks them (its message names the storage key).
        for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
            if meta.get(field) and meta[field] != pod_meta[field]:
                raise conflict("pods", "", pod_name,
                               f"StorageError: invalid object, Code: 4, Key: /registry/pods/{namespace}/{pod_name}, "
                               f"ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: {label} in "
                               f"precondition: {meta[field]}, {label} in object meta: {pod_meta[field]}")
        if pod_meta.get("deletionTimestamp"):
            raise conflict("pods/binding", "", pod_name,
                           f"pod {pod_name} is being deleted, cannot be assigned to a host")
        node = pod.get("spec", {}).get("nodeName")
        if node:
            raise conflict("pods/binding", "", pod_name, f'pod {pod_name} is already assigned to node "{node}"')
        annotations = meta.get("annotations") or {}
        new_meta = {**pod_meta}
        if annotations:
            new_meta["annotations"] = {**(pod_meta.get("annotations") or {}), **annotations}
        status = dict(pod.get("status") or {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conditions.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                           "lastTransitionTime": now_rfc3339()})
        status["conditions"] = conditions
        new = {**pod, "metadata": new_meta, "spec": {**pod["spec"], "nodeName": target["name"]}, "status": status}
        self._commit(PODS, "MODIFIED", new, pod)

    # -- watches -----------------------------------------------------------------------------------------------

    def watch(self, resource: Resource, namespace: str | None, labels: Selector, fields: Selector,
              version: str, wake: Callable[[], None], render: Render | None = None,
              initial_events: bool | None = None) -> Watcher:
        """Open a watch; its first events are queued already (current objects, or the changes since ``version``).

        ``initial_events`` is the request's ``sendInitialEvents``: True sends the current objects first, False
        only changes; None keeps the older rule (current objects for version "" or "0"). ``render`` turns an
        event into its line when the client wants something other than the object itself.
        """
        watcher = Watcher(resource, namespace, labels, fields, wake, render)
        collection = self._collections[resource]
        if initial_events or (initial_events is None and version in ("", "0")):
            for obj in self.list_objects(resource, namespace, labels, fields):
                watcher.pending.append((render or event_line)("ADDED", obj))
        elif version not in ("", "0") and not initial_events:
            since = parse_version(version)
            if since < collection.history_start:
                error = expired(f"too old resource version: {since} ({collection.history_start})")
                watcher.pending.append(orjson.dumps({"type": "ERROR", "object": error.status()}) + b"\n")
                watcher.closed = True
                return watcher
            watcher.since = since
            missed: list[Change] = []
            for change in reversed(collection.history):
                if change.version <= since:
                    break
                missed.append(change)
            for change in reversed(missed):
                watcher.offer(change)
        collection.add_watcher(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        self._collections[watcher.resource].remove_watcher(watcher)

    def close_watches(self) -> None:
        for collection in self._collections.values():
            for watcher in list(collection.watchers):
                watcher.close()

    def bookmark(self, watcher: Watcher, initial_events_end: bool = False) -> bytes | None:
        """A BOOKMARK at the current version, or None while a watch waits for a version still to come.

        The one closing the initial events of a ``sendInitialEvents`` watch carries the annotation
        ``k8s.io/initial-events-end: "true"``, which is how clients know the initial state is complete.
        """
        if self.version < watcher.since:
            return None
        meta: Obj = {"resourceVersion": str(self.version)}
        if initial_events_end:
            meta["annotations"] = {INITIAL_EVENTS_END: "true"}
        marker = {"kind": watcher.resource.kind, "apiVersion": watcher.resource.api_version, "metadata": meta}
        return orjson.dumps({"type": "BOOKMARK", "object": marker}) + b"\n"
