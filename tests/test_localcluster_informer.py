"""``gpushare.kube.informer.Informer`` against the local API server: sync, events, resume, relist on 410."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
from conftest import cluster_spec
from kubernetes import client

from gpushare.kube.informer import Informer, ListRestarted
from gpushare.localcluster import LocalCluster


def pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": "main", "image": "busybox"}]}}


def eventually(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class Recorder:
    """What an informer delivered: each sync's names, and each event."""

    def __init__(self) -> None:
        self.syncs: list[list[str]] = []
        self.events: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def on_sync(self, objects: list[dict[str, Any]]) -> None:
        with self.lock:
            self.syncs.append([o["metadata"]["name"] for o in objects])

    def on_event(self, kind: str, obj: dict[str, Any]) -> None:
        with self.lock:
            self.events.append((kind, obj["metadata"]["name"]))


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(cluster_spec(nodes=1), event_window=5) as local:
        yield local


def start(informer: Informer) -> Informer:
    informer.start()
    assert informer.synced.wait(timeout=10)
    return informer


def test_informer_syncs_then_follows_events(cluster: LocalCluster) -> None:
    core = client.CoreV1Api(cluster.api_client())
    core.create_namespaced_pod("default", pod("existing"))
    seen = Recorder()
    informer = start(Informer(partial(core.list_namespaced_pod, "default"), on_sync=seen.on_sync,
                              on_event=seen.on_event, kind="pods"))
    try:
        core.create_namespaced_pod("default", pod("new"))
        core.delete_namespaced_pod("existing", "default")
        assert eventually(lambda: len(seen.events) == 2)
        assert seen.syncs == [["existing"]]
        assert seen.events == [("ADDED", "new"), ("DELETED", "existing")]
    finally:
        informer.stop()


def test_informer_resumes_after_its_watch_times_out_without_relisting(cluster: LocalCluster) -> None:
    core = client.CoreV1Api(cluster.api_client())
    seen = Recorder()
    calls: list[dict[str, Any]] = []

    def list_pods(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return core.list_pod_for_all_namespaces(**kwargs)

    informer = start(Informer(list_pods, on_sync=seen.on_sync, on_event=seen.on_event, kind="pods",
                              field_selector="spec.nodeName=node-0", watch_timeout_s=1))
    try:
        assert eventually(lambda: sum(1 for c in calls if c.get("watch")) >= 2)  # the first watch ended
        core.create_namespaced_pod("default", {**pod("bound"), "spec": {**pod("bound")["spec"],
                                                                        "nodeName": "node-0"}})
        assert eventually(lambda: seen.events == [("ADDED", "bound")])
        assert seen.syncs == [[]] and informer.relists == 0
        assert all(c.get("field_selector") == "spec.nodeName=node-0" for c in calls)
    finally:
        informer.stop()


def test_informer_relists_when_its_version_expired(cluster: LocalCluster) -> None:
    core = client.CoreV1Api(cluster.api_client())
    for i in range(8):  # more changes than the event window keeps
        core.create_namespaced_pod("default", pod(f"p{i}"))
    seen = Recorder()
    watches = 0

    def list_pods(**kwargs: Any) -> Any:
        nonlocal watches
        if kwargs.get("watch"):
            watches += 1
            if watches == 1:  # as if the informer had been disconnected for a long time
                kwargs["resource_version"] = "2"
        return core.list_namespaced_pod("default", **kwargs)

    informer = start(Informer(list_pods, on_sync=seen.on_sync, on_event=seen.on_event, kind="pods"))
    try:
        assert eventually(lambda: len(seen.syncs) == 2)
        assert informer.relists == 1
        assert seen.syncs[0] == seen.syncs[1] == [f"p{i}" for i in range(8)]
        core.create_namespaced_pod("default", pod("after"))
        assert eventually(lambda: seen.events == [("ADDED", "after")])
    finally:
        informer.stop()


def test_informer_lists_in_pages_and_streams_each_page_as_it_comes(cluster: LocalCluster) -> None:
    core = client.CoreV1Api(cluster.api_client())
    for i in range(7):
        core.create_namespaced_pod("default", pod(f"p{i}"))
    pages: list[dict[str, Any]] = []
    consumed_at_page: list[int] = []  # how many pages had been fetched when each object reached the consumer

    def list_pods(**kwargs: Any) -> Any:
        if not kwargs.get("watch"):
            pages.append(kwargs)
        return core.list_namespaced_pod("default", **kwargs)

    def on_sync(objects: Iterator[dict[str, Any]]) -> None:
        names = []
        for obj in objects:
            consumed_at_page.append(len(pages))
            names.append(obj["metadata"]["name"])
        seen.syncs.append(names)

    seen = Recorder()
    informer = start(Informer(list_pods, on_sync=on_sync, on_event=seen.on_event, kind="pods", page_size=3,
                              streamed=True))
    try:
        assert seen.syncs == [[f"p{i}" for i in range(7)]]
        assert [p["limit"] for p in pages] == [3, 3, 3]
        assert "_continue" not in pages[0] and pages[1]["_continue"] and pages[2]["_continue"]
        # The second page was fetched only once the consumer had used up the first: one page alive at a time.
        assert consumed_at_page == [1, 1, 1, 2, 2, 2, 3]
        core.create_namespaced_pod("default", pod("after"))
        assert eventually(lambda: seen.events == [("ADDED", "after")])  # the watch starts from the snapshot
    finally:
        informer.stop()


def test_informer_starts_the_list_over_when_its_continue_token_expires(cluster: LocalCluster) -> None:
    core = client.CoreV1Api(cluster.api_client())
    for i in range(4):
        core.create_namespaced_pod("default", pod(f"p{i}"))
    lists = 0

    def list_pods(**kwargs: Any) -> Any:
        nonlocal lists
        if not kwargs.get("watch"):
            lists += 1
            if lists == 2:  # between the first list's pages, more changes than the server's history keeps
                for i in range(4, 10):
                    core.create_namespaced_pod("default", pod(f"p{i}"))
        return core.list_namespaced_pod("default", **kwargs)

    seen = Recorder()
    informer = start(Informer(list_pods, on_sync=seen.on_sync, on_event=seen.on_event, kind="pods", page_size=2))
    try:
        assert informer.list_restarts == 1
        # Whole-list mode hands over nothing from the abandoned list: one sync, with every pod of the new one.
        assert seen.syncs == [[f"p{i}" for i in range(10)]]
        assert informer.relists == 0
    finally:
        informer.stop()


def test_a_streamed_consumer_sees_an_expired_list_abandoned_then_gets_the_new_one(cluster: LocalCluster) -> None:
    core = client.CoreV1Api(cluster.api_client())
    for i in range(4):
        core.create_namespaced_pod("default", pod(f"p{i}"))
    lists = 0

    def list_pods(**kwargs: Any) -> Any:
        nonlocal lists
        if not kwargs.get("watch"):
            lists += 1
            if lists == 2:
                for i in range(4, 10):
                    core.create_namespaced_pod("default", pod(f"p{i}"))
        return core.list_namespaced_pod("default", **kwargs)

    outcomes: list[str] = []

    def on_sync(objects: Iterator[dict[str, Any]]) -> None:
        names = []
        try:
            names.extend(o["metadata"]["name"] for o in objects)
        except ListRestarted:
            outcomes.append(f"abandoned after {names}")
            raise
        outcomes.append(f"complete with {len(names)}")

    informer = start(Informer(list_pods, on_sync=on_sync, on_event=lambda kind, obj: None, kind="pods",
                              page_size=2, streamed=True))
    try:
        assert outcomes == ["abandoned after ['p0', 'p1']", "complete with 10"]
    finally:
        informer.stop()
