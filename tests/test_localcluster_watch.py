"""Selectors, and watches through ``kubernetes.watch.Watch().stream`` against the local API server."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from conftest import cluster_spec
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from gpushare.localcluster import LocalCluster


@pytest.fixture
def core(local_cluster: LocalCluster) -> client.CoreV1Api:
    return client.CoreV1Api(local_cluster.api_client())


def pod(name: str, labels: dict[str, str] | None = None, namespace: str = "default") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}}


def bind(core: client.CoreV1Api, name: str, node: str) -> None:
    body = {"metadata": {"name": name}, "target": {"kind": "Node", "name": node}}
    core.create_namespaced_binding("default", body, _preload_content=False)


def names(pods: Any) -> list[str]:
    return [p.metadata.name for p in pods.items]


def events(stream: Any, count: int) -> list[tuple[str, str]]:
    """The next ``count`` events of a watch, as (type, name)."""
    out = []
    for event in stream:
        out.append((event["type"], event["raw_object"]["metadata"].get("name", "")))
        if len(out) == count:
            break
    return out


@pytest.fixture
def labelled(core: client.CoreV1Api) -> client.CoreV1Api:
    core.create_namespaced_pod("default", pod("web-1", {"app": "web", "tier": "front"}))
    core.create_namespaced_pod("default", pod("web-2", {"app": "web"}))
    core.create_namespaced_pod("default", pod("db", {"app": "db", "tier": "back"}))
    return core


@pytest.mark.parametrize(("selector", "expected"), [
    ("app=web", ["web-1", "web-2"]),
    ("app==db", ["db"]),
    ("app!=web", ["db"]),
    ("tier in (front,back)", ["db", "web-1"]),
    ("app in (web), tier notin (front)", ["web-2"]),
    ("tier", ["db", "web-1"]),
    ("!tier", ["web-2"]),
    ("app=web,tier=front", ["web-1"]),
    ("app=nothing", []),
])
def test_label_selectors(labelled: client.CoreV1Api, selector: str, expected: list[str]) -> None:
    assert names(labelled.list_namespaced_pod("default", label_selector=selector)) == expected


def test_field_selectors(labelled: client.CoreV1Api) -> None:
    bind(labelled, "db", "node-0")
    list_pods = labelled.list_pod_for_all_namespaces
    assert names(list_pods(field_selector="spec.nodeName=node-0")) == ["db"]
    assert names(list_pods(field_selector="spec.nodeName=")) == ["web-1", "web-2"]
    assert names(list_pods(field_selector="spec.nodeName!=")) == ["db"]
    assert names(list_pods(field_selector="metadata.name==web-2")) == ["web-2"]
    assert names(list_pods(field_selector="metadata.namespace=default,metadata.name!=db")) == ["web-1", "web-2"]
    assert names(list_pods(field_selector="status.phase=Pending", label_selector="app=web")) == ["web-1", "web-2"]
    assert names(labelled.list_node(field_selector="metadata.name=node-1")) == ["node-1"]


def test_unsupported_field_and_bad_label_selector_are_bad_requests(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as caught:
        core.list_namespaced_pod("default", field_selector="spec.priority=1")
    assert caught.value.status == 400
    assert "field label not supported: spec.priority" in json.loads(caught.value.body)["message"]
    with pytest.raises(ApiException) as caught:
        core.list_namespaced_pod("default", label_selector="app in web")
    assert caught.value.status == 400
    assert "unable to parse requirement" in json.loads(caught.value.body)["message"]


def test_watch_streams_changes_after_the_listed_version(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("before"))
    version = core.list_namespaced_pod("default").metadata.resource_version
    core.create_namespaced_pod("default", pod("p"))
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"x": "1"}}})
    core.delete_namespaced_pod("p", "default")
    stream = watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=version, timeout_seconds=5)
    received = []
    for event in stream:
        received.append(event)
        if len(received) == 3:
            break
    assert [(e["type"], e["object"].metadata.name) for e in received] == [
        ("ADDED", "p"), ("MODIFIED", "p"), ("DELETED", "p")]
    assert received[1]["object"].metadata.labels == {"x": "1"}
    versions = [int(e["object"].metadata.resource_version) for e in received]
    assert versions == sorted(versions) and versions[0] > int(version)


def test_watch_without_a_version_starts_with_the_current_objects(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("a"))
    core.create_namespaced_pod("default", pod("b"))
    stream = watch.Watch().stream(core.list_namespaced_pod, "default", timeout_seconds=5)
    assert events(stream, 2) == [("ADDED", "a"), ("ADDED", "b")]


def test_watch_receives_changes_made_while_it_is_open(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("marker"))
    stream = watch.Watch().stream(core.list_namespaced_pod, "default", resource_version="0", timeout_seconds=10)
    opened = threading.Event()
    received: list[tuple[str, str]] = []

    def consume() -> None:
        for event in stream:
            received.append((event["type"], event["object"].metadata.name))
            opened.set()
            if len(received) == 3:
                break

    thread = threading.Thread(target=consume)
    thread.start()
    assert opened.wait(timeout=10)
    core.create_namespaced_pod("default", pod("live"))  # the open watch does not block other requests
    core.delete_namespaced_pod("live", "default")
    thread.join(timeout=10)
    assert received == [("ADDED", "marker"), ("ADDED", "live"), ("DELETED", "live")]


def test_label_selected_watch_sees_objects_enter_and_leave(core: client.CoreV1Api) -> None:
    version = core.list_namespaced_pod("default").metadata.resource_version
    core.create_namespaced_pod("default", pod("p", {"app": "other"}))
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"app": "web"}}})
    core.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"n": "1"}}})
    left = core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"app": "db"}}})
    stream = watch.Watch().stream(core.list_namespaced_pod, "default", label_selector="app=web",
                                  resource_version=version, timeout_seconds=5)
    received = []
    for event in stream:
        received.append(event["raw_object"])
        if len(received) == 3:
            break
    assert [(r["metadata"]["labels"]["app"], r["metadata"].get("annotations")) for r in received] == [
        ("web", None), ("web", {"n": "1"}), ("web", {"n": "1"})]
    # Leaving the selector reads as DELETED with the last matching content and the new version.
    assert received[2]["metadata"]["resourceVersion"] == left.metadata.resource_version


def test_label_selected_watch_event_types(core: client.CoreV1Api) -> None:
    version = core.list_namespaced_pod("default").metadata.resource_version
    core.create_namespaced_pod("default", pod("p", {"app": "other"}))
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"app": "web"}}})
    core.patch_namespaced_pod("p", "default", {"metadata": {"annotations": {"n": "1"}}})
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"app": "db"}}})
    stream = watch.Watch().stream(core.list_namespaced_pod, "default", label_selector="app=web",
                                  resource_version=version, timeout_seconds=5)
    assert events(stream, 3) == [("ADDED", "p"), ("MODIFIED", "p"), ("DELETED", "p")]


def test_node_field_selected_watch_sees_the_binding(core: client.CoreV1Api) -> None:
    version = core.list_namespaced_pod("default").metadata.resource_version
    core.create_namespaced_pod("default", pod("elsewhere"))
    core.create_namespaced_pod("default", pod("here"))
    bind(core, "elsewhere", "node-1")
    bind(core, "here", "node-0")
    core.delete_namespaced_pod("here", "default")
    stream = watch.Watch().stream(core.list_pod_for_all_namespaces, field_selector="spec.nodeName=node-0",
                                  resource_version=version, timeout_seconds=5)
    assert events(stream, 2) == [("ADDED", "here"), ("DELETED", "here")]


def test_watches_of_single_nodes_see_only_their_node(core: client.CoreV1Api) -> None:
    version = core.list_node().metadata.resource_version
    # Opened before the changes, so that the changes are dispatched to it live (as to a kubelet).
    response = core.list_node(watch=True, field_selector="metadata.name=node-0", resource_version=version,
                              timeout_seconds=5, _preload_content=False)
    core.patch_node_status("node-1", {"status": {"capacity": {"pods": "100"}}})
    core.patch_node_status("node-0", {"status": {"capacity": {"pods": "90"}}})
    first = json.loads(next(response.stream(amt=None)).splitlines()[0])
    response.close()
    assert (first["type"], first["object"]["metadata"]["name"]) == ("MODIFIED", "node-0")
    everything = watch.Watch().stream(core.list_node, resource_version=version, timeout_seconds=5)
    assert events(everything, 2) == [("MODIFIED", "node-1"), ("MODIFIED", "node-0")]


def test_watch_from_an_expired_version_is_gone() -> None:
    with LocalCluster(cluster_spec(nodes=1), event_window=3) as cluster:
        core = client.CoreV1Api(cluster.api_client())
        version = core.list_namespaced_pod("default").metadata.resource_version
        for i in range(5):
            core.create_namespaced_pod("default", pod(f"p{i}"))
        with pytest.raises(ApiException) as caught:
            list(watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=version,
                                      timeout_seconds=5))
        assert caught.value.status == 410 and caught.value.reason.startswith("Expired: too old resource version")
        raw = core.list_namespaced_pod("default", watch=True, resource_version=version, _preload_content=False)
        event = json.loads(raw.data.splitlines()[0])
        assert event["type"] == "ERROR"
        assert (event["object"]["kind"], event["object"]["code"], event["object"]["reason"]) == (
            "Status", 410, "Expired")
        # The last three changes are still in the window.
        recent = watch.Watch().stream(core.list_namespaced_pod, "default", resource_version=str(int(version) + 2),
                                      timeout_seconds=5)
        assert events(recent, 3) == [("ADDED", "p2"), ("ADDED", "p3"), ("ADDED", "p4")]


def test_watch_ends_at_its_timeout_with_a_bookmark(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p"))
    version = core.list_namespaced_pod("default").metadata.resource_version
    raw = core.list_namespaced_pod("default", watch=True, resource_version=version, timeout_seconds=1,
                                   allow_watch_bookmarks=True, _preload_content=False)
    lines = [json.loads(line) for line in raw.data.splitlines()]  # returns once the server ends the stream
    assert [(e["type"], e["object"]["kind"], e["object"]["metadata"]["resourceVersion"]) for e in lines] == [
        ("BOOKMARK", "Pod", version)]


def test_watch_of_leases(local_cluster: LocalCluster) -> None:
    leases = client.CoordinationV1Api(local_cluster.api_client())
    leases.create_namespaced_lease("kube-system", {"metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}})
    stream = watch.Watch().stream(leases.list_namespaced_lease, "kube-system", timeout_seconds=5)
    assert events(stream, 1) == [("ADDED", "l")]


def test_stopping_the_cluster_ends_open_watches() -> None:
    cluster = LocalCluster(cluster_spec(nodes=1)).start()
    core = client.CoreV1Api(cluster.api_client())
    opened, ended = threading.Event(), threading.Event()

    def consume() -> None:
        for _ in watch.Watch().stream(core.list_node, timeout_seconds=60):
            opened.set()
        ended.set()

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    assert opened.wait(timeout=10)
    cluster.stop()
    thread.join(timeout=10)
    assert ended.is_set()
