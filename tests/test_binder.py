"""The bind's two halves: the reservation made on the event loop from the watch's copy of the pod (``Binder.hold``),
and the Binding made in a thread with that reservation (``Binder.bind``), against the local API server."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import pytest
from kubernetes import client
from test_cache_watch import used
from test_extender_harness import T4, T4_MIB, create_pod, gpu_node, pod_body, read_pod, spec, wait_for

from extender.binder import Binder
from extender.placement import PolicyBook
from extender.wire import BindingArgs
from gpushare.cache.state import ClusterCache
from gpushare.contract import ANN_IDX, MemoryUnit
from gpushare.kube.api import DEFAULT_TIMEOUT_S, Kube, Obj, Pods
from gpushare.kube.watch import ClusterWatch
from gpushare.localcluster import LocalCluster


class CountingPods(Pods):
    """The extender's pod calls, counted."""

    def __init__(self, api_client: client.ApiClient) -> None:
        super().__init__(api_client)
        self.reads = 0
        self.bindings = 0

    def read(self, namespace: str, name: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Obj:
        self.reads += 1
        return super().read(namespace, name, timeout_s=timeout_s)

    def bind(self, namespace: str, name: str, uid: str, node: str, *, annotations: Mapping[str, str] | None = None,
             resource_version: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.bindings += 1
        super().bind(namespace, name, uid, node, annotations=annotations, resource_version=resource_version,
                     timeout_s=timeout_s)


class Parts:
    def __init__(self, cluster: LocalCluster) -> None:
        kube = Kube.from_api_client(cluster.api_client())
        self.core = client.CoreV1Api(cluster.api_client())
        self.cache = ClusterCache(MemoryUnit.GiB, 0)
        self.watch = ClusterWatch(kube.nodes.list_call, kube.pods.list_call, self.cache,
                                  list_budgets=kube.budgets.list_call)
        self.pods = CountingPods(cluster.api_client())
        self.binder = Binder(self.pods, self.cache, PolicyBook("binpack"), self.watch.pending, lambda: None)

    def waiting(self, pod: Obj) -> BindingArgs:
        """The bind's arguments for ``pod`` on t4x2, once the watch shows the pod waiting for a node."""
        name = pod["metadata"]["name"]
        wait_for(lambda: self.watch.pending.get("default", name) is not None, "the watch to see the pod")
        return BindingArgs(name, "default", pod["metadata"]["uid"], "t4x2")


@pytest.fixture
def parts() -> Iterator[Parts]:
    with LocalCluster(spec(gpu_node("t4x2", (T4, T4_MIB), (T4, T4_MIB)))) as cluster:
        made = Parts(cluster)
        made.watch.start()
        try:
            wait_for(lambda: made.watch.synced, "the watch's first list")
            yield made
        finally:
            made.watch.stop()


def test_hold_reserves_from_the_watch_and_bind_makes_only_the_binding_with_it(parts: Parts) -> None:
    args = parts.waiting(create_pod(parts.core, pod_body("whole", 15)))
    held = parts.binder.hold(args)
    # Reserved in memory, before any call to the API server.
    assert held is not None and (parts.pods.reads, parts.pods.bindings) == (0, 0)
    assert sorted(used(parts.cache, "t4x2")) == [0, 15] and parts.cache.reservations() == 1
    outcome = parts.binder.bind(args, held)
    assert outcome.error == "" and outcome.gpus == held.reservation.placement.gpu_indices
    # One Binding, and the GPUs held: no second reservation, no read.
    assert (parts.pods.reads, parts.pods.bindings) == (0, 1)
    assert sorted(used(parts.cache, "t4x2")) == [0, 15]
    stored = read_pod(parts.core, "whole")
    assert stored["spec"]["nodeName"] == "t4x2"
    assert stored["metadata"]["annotations"][ANN_IDX] == str(outcome.gpus[0])
    wait_for(lambda: parts.cache.reservations() == 0, "the watch to confirm the bind")
    assert sorted(used(parts.cache, "t4x2")) == [0, 15]


def test_a_pod_that_cannot_be_held_is_left_to_the_bind_which_answers_why(parts: Parts) -> None:
    for name in ("first", "second"):
        args = parts.waiting(create_pod(parts.core, pod_body(name, 15)))
        assert parts.binder.bind(args, parts.binder.hold(args)).error == ""
    wait_for(lambda: parts.cache.reservations() == 0, "the watch to confirm both binds")
    args = parts.waiting(create_pod(parts.core, pod_body("third", 15)))
    assert parts.binder.hold(args) is None
    assert parts.cache.reservations() == 0 and parts.pods.bindings == 2
    error = parts.binder.bind(args, None).error
    assert error == ("gpushare could not bind pod default/third to node t4x2: the pod no longer fits: node(s) have 0 "
                     "GPU(s) with 15 GiB free, the pod needs 1"), error
    assert not read_pod(parts.core, "third")["spec"].get("nodeName")
