"""The cache fed by real list and watch calls against the local API server."""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from test_extender_harness import T4, T4_MIB, create_pod, gpu_node, pod_body, spec, wait_for

from extender.inspect import inspect_nodes
from gpushare.cache.state import ClusterCache
from gpushare.contract import (
    ANN_NODE_INVENTORY,
    GPUInventoryEntry,
    MemoryUnit,
    encode_inventory,
    new_assignment,
    parse_request,
)
from gpushare.kube.convert import MAX_SHARED_CONTAINERS, SHARED_MAX_CHARS, pod_info
from gpushare.kube.watch import ClusterWatch
from gpushare.localcluster import LocalCluster


def bound_pod(name: str, units: int, node: str, gpu: int) -> dict[str, Any]:
    body = pod_body(name, units, node=node)
    assignment = new_assignment(parse_request(pod_info(body)), [gpu], 15, MemoryUnit.GiB, 1)
    body["metadata"]["annotations"] = assignment.annotations()
    return body


def used(cache: ClusterCache, node: str) -> list[int]:
    views = inspect_nodes(cache, node)
    return [d["usedGPU"] for d in views[0]["devs"]] if views else []


class ExpiringPodWatch:
    """The core API as the informer sees it, except that the first pod watch waits for the test and then
    asks for a resource version the server has long forgotten (as after a long disconnection)."""

    def __init__(self, core: client.CoreV1Api) -> None:
        self._core = core
        self.watch_requested = threading.Event()
        self.resume = threading.Event()
        self._expired = False
        self.lists = 0

    def list_node(self, **kwargs: Any) -> Any:
        return self._core.list_node(**kwargs)

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> Any:
        if not kwargs.get("watch"):
            self.lists += 1
        elif not self._expired:
            self._expired = True
            self.watch_requested.set()
            self.resume.wait(10)
            kwargs["resource_version"] = "1"
        return self._core.list_pod_for_all_namespaces(**kwargs)


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(spec(gpu_node("n1", (T4, T4_MIB), (T4, T4_MIB))), event_window=1) as local:
        yield local


def test_expired_watch_relists_and_replaces_state(cluster: LocalCluster) -> None:
    core = client.CoreV1Api(cluster.api_client())
    create_pod(core, bound_pod("old", 5, "n1", 0))
    api = ExpiringPodWatch(core)
    cache = ClusterCache()
    watch = ClusterWatch(api.list_node, api.list_pod_for_all_namespaces, cache)
    watch.start()
    try:
        assert api.watch_requested.wait(10)
        wait_for(lambda: used(cache, "n1") == [5, 0], "the first list")
        core.delete_namespaced_pod("old", "default", grace_period_seconds=0)
        create_pod(core, bound_pod("new", 7, "n1", 1))
        create_pod(core, pod_body("pending", 3))
        api.resume.set()
        wait_for(lambda: used(cache, "n1") == [0, 7], "the relist after the expired watch")
        assert api.lists == 2
    finally:
        watch.stop()


def test_watch_follows_pods_and_node_inventory(cluster: LocalCluster) -> None:
    core = client.CoreV1Api(cluster.api_client())
    cache = ClusterCache()
    watch = ClusterWatch(core.list_node, core.list_pod_for_all_namespaces, cache)
    watch.start()
    try:
        assert watch.wait_synced(10)
        create_pod(core, bound_pod("a", 4, "n1", 1))
        wait_for(lambda: used(cache, "n1") == [0, 4], "the new pod")
        core.patch_namespaced_pod_status("a", "default", {"status": {"phase": "Succeeded"}},
                                         _content_type="application/merge-patch+json")
        wait_for(lambda: used(cache, "n1") == [0, 0], "the finished pod to stop counting")
        inventory = encode_inventory([GPUInventoryEntry(0, T4, T4_MIB), GPUInventoryEntry(1, "A100", 81920),
                                      GPUInventoryEntry(2, "A100", 81920)])
        core.patch_node("n1", {"metadata": {"annotations": {ANN_NODE_INVENTORY: inventory}}},
                        _content_type="application/merge-patch+json")
        wait_for(lambda: [d["totalGPU"] for d in inspect_nodes(cache, "n1")[0]["devs"]] == [15, 80, 80],
                 "the device plugin's new inventory")
    finally:
        watch.stop()


def test_pending_pods_of_one_workload_share_their_strings_and_containers(cluster: LocalCluster) -> None:
    """Each decoded pod brings its own copy of every string; at 60,000 pending pods those copies of what the
    replicas of a workload have in common (namespace, phase, containers and their quantities) took 60 MB, and as
    much stayed in half-empty allocator pools once the pods were bound."""
    core = client.CoreV1Api(cluster.api_client())
    create_pod(core, pod_body("listed", 3))
    cache = ClusterCache()
    watch = ClusterWatch(core.list_node, core.list_pod_for_all_namespaces, cache)
    watch.start()
    try:
        assert watch.wait_synced(10)
        create_pod(core, pod_body("watched", 3))
        wait_for(lambda: watch.pending.get("default", "watched") is not None, "the new pod")
        listed, watched = watch.pending.get("default", "listed"), watch.pending.get("default", "watched")
        assert listed is not None and watched is not None
        assert listed.containers[0] is watched.containers[0]
        assert listed.namespace is watched.namespace and listed.phase is watched.phase
        assert (listed.name, watched.name) == ("listed", "watched")
    finally:
        watch.stop()


def test_sharing_stays_bounded_and_leaves_long_or_many_values_intact() -> None:
    """Hostile or merely large clusters: more distinct containers than are shared at once, and an annotation far
    longer than any shared string, convert exactly; replicas still share their container once sharing started
    over."""
    long_value = "x" * (100 * SHARED_MAX_CHARS)
    for i in range(MAX_SHARED_CONTAINERS + 2):
        body = pod_body(f"p{i}", 1 + i % 7)
        body["spec"]["containers"][0]["name"] = f"c{i}"
        body["metadata"]["annotations"] = {"note": long_value}
        first, second = pod_info(body), pod_info(copy.deepcopy(body))
        assert first.containers[0] is second.containers[0]
        assert first.containers[0].name == f"c{i}" and first.annotations["note"] == long_value
