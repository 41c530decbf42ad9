"""The scheduler loop: kube-scheduler's extender protocol end to end, against the extender and the local cluster."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from kubernetes import client
from test_extender_harness import (
    T4,
    T4_MIB,
    V100_32,
    V100_32_MIB,
    create_pod,
    emptied_core,
    gpu_node,
    pod_body,
    read_pod,
    running_extender,
    spec,
    wait_for,
)

from extender.config import ExtenderConfig
from gpushare.contract import ANN_IDX
from gpushare.localcluster import LocalCluster
from gpushare.localcluster.scheduler import SchedulerLoop

CLUSTER = spec(gpu_node("big", (T4, T4_MIB), (V100_32, V100_32_MIB), cpu="8"),
               gpu_node("small", (T4, T4_MIB), cpu="4"))


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(CLUSTER) as local:
        yield local


@pytest.fixture(scope="module")
def extender(cluster: LocalCluster) -> Iterator[str]:
    # the placements asserted below are binpack's, whatever the default policy is
    with running_extender(cluster, ExtenderConfig(policy="binpack")) as url:
        yield url + "/gpushare-scheduler"


@pytest.fixture
def core(cluster: LocalCluster) -> client.CoreV1Api:
    return emptied_core(cluster)


def events_for(core: client.CoreV1Api, pod: str) -> list[tuple[str, str]]:
    listed: Any = core.list_namespaced_event("default", _preload_content=False)
    return [(e["reason"], e["message"]) for e in orjson.loads(listed.data)["items"]
            if e["involvedObject"]["name"] == pod]


@pytest.mark.parametrize("node_cache_capable", [True, False])
def test_gpu_pods_are_placed_through_the_extender(cluster: LocalCluster, extender: str, core: client.CoreV1Api,
                                                  node_cache_capable: bool) -> None:
    for name, units in (("a", 10), ("b", 20), ("c", 4)):
        create_pod(core, pod_body(name, units))
    with SchedulerLoop(cluster.api_client(), extender, node_cache_capable=node_cache_capable, seed=1) as loop:
        results = {r.pod: r for r in loop.schedule_once()}
    assert all(r.scheduled for r in results.values()), results
    placed = {name: (read_pod(core, name)["spec"]["nodeName"], read_pod(core, name)["metadata"]["annotations"][ANN_IDX])
              for name in "abc"}
    # binpack: 10 fills a T4 best on either node; 20 only fits the V100; 4 goes where 5 are left (the T4 with 10)
    assert placed["b"] == ("big", "1")
    assert placed["c"] == (placed["a"][0], "0")
    assert ("Scheduled", f"Successfully assigned default/a to {placed['a'][0]}") in events_for(core, "a")


def test_pod_without_gpu_is_bound_by_the_loop_itself(cluster: LocalCluster, extender: str,
                                                     core: client.CoreV1Api) -> None:
    create_pod(core, pod_body("plain", cpu="6"))
    with SchedulerLoop(cluster.api_client(), extender, seed=1) as loop:
        result = loop.schedule_pod("plain")
    assert result.node == "big"  # the only node with 6 CPUs
    assert ANN_IDX not in (read_pod(core, "plain")["metadata"].get("annotations") or {})


def test_failures_explain_themselves_and_record_an_event(cluster: LocalCluster, extender: str,
                                                         core: client.CoreV1Api) -> None:
    create_pod(core, pod_body("huge", 40))
    create_pod(core, pod_body("greedy", 1, cpu="64"))
    with SchedulerLoop(cluster.api_client(), extender, seed=1) as loop:
        huge = loop.schedule_pod("huge")
        greedy = loop.schedule_pod("greedy")
    assert not huge.scheduled
    assert huge.message.startswith("0/2 nodes are available: ")
    # Reasons name no node, so kube-scheduler counts the nodes that fail alike instead of listing each one.
    assert huge.message.startswith("0/2 nodes are available: 1 Insufficient aliyun.com/gpu-mem, 1 node(s) have 0 "
                                   "GPU(s) of 40 GiB or more, the pod needs 1 (their largest GPU has 32 GiB). "
                                   "preemption: ")
    assert ("FailedScheduling", huge.message) in events_for(core, "huge")
    # kube-scheduler's wording, its preemption's included: no pod of lower priority to evict anywhere.
    assert greedy.message == ("0/2 nodes are available: 2 Insufficient cpu. preemption: 0/2 nodes are available: 2 "
                              "No preemption victims found for incoming pod.")
    assert not read_pod(core, "huge")["spec"].get("nodeName")


def test_extender_errors_fail_the_attempt(cluster: LocalCluster, extender: str, core: client.CoreV1Api) -> None:
    create_pod(core, pod_body("odd", 3, gpu_count=2))
    create_pod(core, pod_body("lost", 2))
    with SchedulerLoop(cluster.api_client(), extender, seed=1) as loop:
        assert "does not divide evenly" in loop.schedule_pod("odd").message
    with SchedulerLoop(cluster.api_client(), extender + "/wrong-prefix", seed=1) as loop:
        result = loop.schedule_pod("lost")
    assert not result.scheduled
    assert "the extender's filter call answered HTTP 404" in result.message


def test_background_loop_schedules_new_pods_and_retries(cluster: LocalCluster, extender: str,
                                                        core: client.CoreV1Api) -> None:
    create_pod(core, pod_body("blocker", 30))
    with SchedulerLoop(cluster.api_client(), extender, seed=1) as loop:
        assert loop.schedule_pod("blocker").node == "big"
        loop.start()
        create_pod(core, pod_body("later", 25))  # fits nowhere until the blocker goes
        create_pod(core, pod_body("now", 2))
        wait_for(lambda: bool(read_pod(core, "now")["spec"].get("nodeName")), "the new pod to be scheduled")
        wait_for(lambda: any(r == "FailedScheduling" for r, _ in events_for(core, "later")), "a failed attempt")
        core.delete_namespaced_pod("blocker", "default", grace_period_seconds=0)
        wait_for(lambda: read_pod(core, "later")["spec"].get("nodeName") == "big", "the retry after backoff",
                 timeout_s=20)


def test_a_pod_no_node_has_room_for_waits_for_room_instead_of_retrying(cluster: LocalCluster, extender: str,
                                                                      core: client.CoreV1Api) -> None:
    """kube-scheduler parks a pod its own checks rejected everywhere until a cluster event may have made room; a
    pod only the extender rejected carries no plugin's queueing hint and is retried after its backoff."""
    create_pod(core, pod_body("hog", cpu="7"))
    with SchedulerLoop(cluster.api_client(), extender, seed=1) as loop:
        assert loop.schedule_pod("hog").node == "big"  # 1 of big's 8 CPUs left, small has 4
        loop.start()
        create_pod(core, pod_body("waiter", cpu="6"))
        create_pod(core, pod_body("too-big", 40))  # passes the loop's checks; the extender rejects it everywhere

        def failures(pod: str) -> int:
            loop.wait_for_events()
            return sum(reason == "FailedScheduling" for reason, _ in events_for(core, pod))

        wait_for(lambda: failures("too-big") >= 2, "the extender-rejected pod to be retried after its backoff")
        assert failures("waiter") == 1
        core.delete_namespaced_pod("hog", "default", grace_period_seconds=0)
        wait_for(lambda: read_pod(core, "waiter")["spec"].get("nodeName") == "big",
                 "the parked pod once room was freed")
        assert failures("waiter") == 1


def test_a_parked_pod_is_tried_again_when_a_node_joins() -> None:
    with LocalCluster(spec(gpu_node("small", cpu="2"))) as local:
        core = client.CoreV1Api(local.api_client())
        create_pod(core, pod_body("wide", cpu="4"))
        with SchedulerLoop(local.api_client(), None, seed=1) as loop:
            loop.start()
            wait_for(lambda: bool(events_for(core, "wide")), "the failed attempt")
            room = {"cpu": "8", "memory": "32Gi", "pods": "110"}
            core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "roomy"},
                              "status": {"capacity": room, "allocatable": room}})
            wait_for(lambda: read_pod(core, "wide")["spec"].get("nodeName") == "roomy", "the pod on the new node")


def test_extender_url_gets_verbs_appended(cluster: LocalCluster, extender: str, core: client.CoreV1Api) -> None:
    create_pod(core, pod_body("p", 1))
    with SchedulerLoop(cluster.api_client(), extender + "/", seed=1) as loop:
        assert loop.schedule_pod("p").scheduled
