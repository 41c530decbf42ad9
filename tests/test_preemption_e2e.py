"""Preemption end to end: the local API server, the extender over HTTP and the scheduler loop's kube-scheduler
flow (dry run, preempt verb, node choice, eviction, nomination, a later cycle)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
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
from gpushare.contract import ANN_GPU_COUNT, ANN_GPU_MODEL, ANN_IDX, Assignment, MemoryUnit
from gpushare.localcluster import LocalCluster
from gpushare.localcluster.scheduler import SchedulerLoop

CLUSTER = spec(gpu_node("two-t4", (T4, T4_MIB), (T4, T4_MIB), cpu="8"),
               gpu_node("mixed", (T4, T4_MIB), (V100_32, V100_32_MIB), cpu="8"))


PRIORITIES = (0, 1, 2, 3, 5, 10, 100, 1000)


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(CLUSTER) as local:
        scheduling = client.SchedulingV1Api(local.api_client())
        # The API server's Priority admission sets spec.priority from the pod's class, and only from it.
        for value in PRIORITIES:
            scheduling.create_priority_class({"metadata": {"name": f"prio-{value}"}, "value": value})
        scheduling.create_priority_class({"metadata": {"name": "prio-10-never"}, "value": 10,
                                          "preemptionPolicy": "Never"})
        yield local


@pytest.fixture(scope="module")
def extender(cluster: LocalCluster) -> Iterator[str]:
    with running_extender(cluster, ExtenderConfig(policy="binpack")) as url:
        yield url + "/gpushare-scheduler"


@pytest.fixture
def core(cluster: LocalCluster) -> client.CoreV1Api:
    api = emptied_core(cluster)
    client.PolicyV1Api(cluster.api_client()).delete_collection_namespaced_pod_disruption_budget("default")
    return api


def with_priority(body: dict[str, Any], priority: int, never: bool = False) -> dict[str, Any]:
    body["spec"]["priorityClassName"] = f"prio-{priority}" + ("-never" if never else "")
    return body


def admitted(body: dict[str, Any], priority: int) -> dict[str, Any]:
    """A pod as kube-scheduler sends it to the extender: admission has set its priority from its class."""
    with_priority(body, priority)["spec"]["priority"] = priority
    return body


def running(core: client.CoreV1Api, name: str, node: str, gpus: tuple[int, ...], per_gpu: int,
            priority: int, labels: dict[str, str] | None = None) -> None:
    """A pod already placed by gpushare: bound, with its assignment written, as after a bind."""
    assignment = Assignment(gpu_indices=gpus, total=per_gpu * len(gpus), gpu_memory=15, assume_time_ns=1,
                            unit=MemoryUnit.GiB, assigned=True)
    annotations = {ANN_GPU_COUNT: str(len(gpus))} if len(gpus) > 1 else {}
    body = with_priority(pod_body(name, per_gpu * len(gpus), node=node, annotations=annotations,
                                  extra_annotations=assignment.annotations()), priority)
    body["metadata"]["labels"] = labels or {}
    create_pod(core, body)


def budget(cluster: LocalCluster, name: str, app: str, allowed: int) -> None:
    """A PodDisruptionBudget over the pods labelled ``app``; its status written as the disruption controller
    would (the local cluster runs no controllers)."""
    policy = client.PolicyV1Api(cluster.api_client())
    policy.create_namespaced_pod_disruption_budget("default", {"metadata": {"name": name}, "spec": {
        "maxUnavailable": allowed, "selector": {"matchLabels": {"app": app}}}})
    policy.patch_namespaced_pod_disruption_budget_status(name, "default", {"status": {"disruptionsAllowed": allowed}})


def pods(core: client.CoreV1Api) -> set[str]:
    return {p.metadata.name for p in core.list_namespaced_pod("default").items}


def events(core: client.CoreV1Api, reason: str) -> set[str]:
    listed: Any = core.list_namespaced_event("default", _preload_content=False)
    return {e["involvedObject"]["name"] for e in orjson.loads(listed.data)["items"] if e["reason"] == reason}


def schedule_after_preemption(loop: SchedulerLoop, core: client.CoreV1Api, name: str, survivors: set[str]) -> str:
    """The first cycle preempts and nominates; a later one, once the victims are gone, binds."""
    first = loop.schedule_pod(name)
    assert not first.scheduled, first
    wait_for(lambda: pods(core) == survivors | {name}, "the victims' deletion")
    assert read_pod(core, name)["status"].get("nominatedNodeName")
    node: list[str] = []

    def bound() -> bool:
        result = loop.schedule_pod(name)
        node.extend([result.node] if result.node else [])
        return result.scheduled

    wait_for(bound, f"{name} to be scheduled on its nominated node")
    return node[0]


def test_preempts_exactly_the_pods_on_the_gpu_that_frees_room(cluster: LocalCluster, extender: str,
                                                              core: client.CoreV1Api) -> None:
    # GPU 0 holds a (10) and c (4) at priority 1, GPU 1 holds b (10) and d (4) at priority 2: 1 unit left on each.
    running(core, "a", "two-t4", (0,), 10, 1)
    running(core, "c", "two-t4", (0,), 4, 1)
    running(core, "b", "two-t4", (1,), 10, 2)
    running(core, "d", "two-t4", (1,), 4, 2)
    running(core, "full-t4", "mixed", (0,), 15, 100)
    running(core, "full-v100", "mixed", (1,), 32, 100)
    create_pod(core, with_priority(pod_body("urgent", 12), 10))
    with SchedulerLoop(cluster.api_client(), extender, seed=1) as loop:
        # kube-scheduler's own dry run counts memory per node and would evict "a" alone, leaving 11 units on
        # GPU 0; the extender asks for both pods of GPU 0, the lowest-priority pair that frees 12 units.
        node = schedule_after_preemption(loop, core, "urgent", {"b", "d", "full-t4", "full-v100"})
        loop.wait_for_events()
    assert node == "two-t4"
    assert read_pod(core, "urgent")["metadata"]["annotations"][ANN_IDX] == "0"
    assert events(core, "Preempted") == {"a", "c"}


def test_model_constraints_pick_the_victim_on_the_right_model(cluster: LocalCluster, extender: str,
                                                             core: client.CoreV1Api) -> None:
    running(core, "on-t4", "mixed", (0,), 15, 0)
    running(core, "on-v100", "mixed", (1,), 30, 3)
    running(core, "t4-a", "two-t4", (0,), 15, 100)
    running(core, "t4-b", "two-t4", (1,), 15, 100)
    create_pod(core, with_priority(pod_body("v100-only", 10, annotations={ANN_GPU_MODEL: V100_32}), 10))
    with SchedulerLoop(cluster.api_client(), extender, seed=1) as loop:
        # Per node, kube-scheduler would take the lowest-priority "on-t4"; the pod can only use the V100.
        node = schedule_after_preemption(loop, core, "v100-only", {"on-t4", "t4-a", "t4-b"})
    assert node == "mixed"
    assert read_pod(core, "v100-only")["metadata"]["annotations"][ANN_IDX] == "1"


def test_multi_gpu_pod_frees_room_on_two_gpus(cluster: LocalCluster, extender: str, core: client.CoreV1Api) -> None:
    running(core, "left", "two-t4", (0,), 10, 1)
    running(core, "right", "two-t4", (1,), 10, 1)
    running(core, "tiny", "two-t4", (0,), 2, 0)
    running(core, "mixed-full", "mixed", (0, 1), 15, 100)
    create_pod(core, with_priority(pod_body("pair", 16, annotations={ANN_GPU_COUNT: "2"}), 10))
    with SchedulerLoop(cluster.api_client(), extender, seed=1) as loop:
        node = schedule_after_preemption(loop, core, "pair", {"tiny", "mixed-full"})
    assert node == "two-t4"


@pytest.mark.parametrize("how", [{"labels": {"sharedgpu/priority": "0"}}, {"never": True}])
def test_opportunistic_pods_never_preempt(cluster: LocalCluster, extender: str, core: client.CoreV1Api,
                                          how: dict[str, Any]) -> None:
    running(core, "low", "two-t4", (0,), 15, 0)
    running(core, "low2", "two-t4", (1,), 15, 0)
    running(core, "high", "mixed", (0,), 15, 100)
    running(core, "high2", "mixed", (1,), 32, 100)
    body = with_priority(pod_body("waiter", 8), 10, never="never" in how)
    body["metadata"].update(how if "labels" in how else {})
    create_pod(core, body)
    with SchedulerLoop(cluster.api_client(), extender, seed=1) as loop:
        result = loop.schedule_pod("waiter")
    assert not result.scheduled
    assert "preemption:" in result.message
    assert pods(core) == {"low", "low2", "high", "high2", "waiter"}
    assert not read_pod(core, "waiter")["status"].get("nominatedNodeName")


def test_a_nominated_pod_keeps_its_room_from_lower_priority_pods(cluster: LocalCluster, extender: str,
                                                                 core: client.CoreV1Api) -> None:
    running(core, "a", "two-t4", (0,), 10, 1)
    # GPU 1 keeps 1 unit free once the marker below is there; kube-scheduler's per-node count sees room for
    # "sneaky" (4) next to the nominated "urgent" (12), so only the extender's per-GPU view can refuse it.
    running(core, "b", "two-t4", (1,), 13, 2)
    running(core, "mixed-t4", "mixed", (0,), 15, 100)
    running(core, "mixed-v100", "mixed", (1,), 32, 100)
    create_pod(core, with_priority(pod_body("urgent", 12), 10))
    with SchedulerLoop(cluster.api_client(), extender, seed=1) as loop:
        assert not loop.schedule_pod("urgent").scheduled
        wait_for(lambda: pods(core) == {"b", "mixed-t4", "mixed-v100", "urgent"}, "the victim's deletion")
        # A marker bound after the nomination: once the extender shows it, its watch has seen the nomination.
        running(core, "marker", "two-t4", (1,), 1, 1000)
        wait_for(lambda: any(p["name"] == "marker" for d in httpx.get(extender + "/inspect/two-t4").json()["nodes"][0]
                             ["devs"] for p in d["pods"]), "the extender to see the marker")
        create_pod(core, with_priority(pod_body("sneaky", 4), 5))
        sneaky = loop.schedule_pod("sneaky")
        assert not sneaky.scheduled
        assert "nominated there by a preemption (default/urgent)" in sneaky.message
        # Named by no node, so kube-scheduler counts it like its own reasons.
        assert "1 node(s) have room only for pods nominated there" in sneaky.message
        assert loop.schedule_pod("urgent").node == "two-t4"


def test_preempt_verb_over_http(cluster: LocalCluster, extender: str, core: client.CoreV1Api) -> None:
    running(core, "x", "two-t4", (0,), 15, 1, labels={"app": "x"})
    running(core, "y", "two-t4", (1,), 15, 1, labels={"app": "y"})
    budget(cluster, "guard-x", "x", 0)
    uid = {p.metadata.name: p.metadata.uid for p in core.list_namespaced_pod("default").items}
    wait_for(lambda: _on_two_t4(extender, uid["x"]).get("Pods") == [{"UID": uid["y"]}],
             "the extender to see the budget")
    # kube-scheduler proposed "x", which a budget protects: "y" is as good and violates none.
    assert _answer(extender, uid["x"], "p") == {"NodeNameToMetaVictims": {"two-t4": {"Pods": [{"UID": uid["y"]}],
                                                                                     "NumPDBViolations": 0}}}
    preemptor = admitted(pod_body("p", 8), 5)
    preemptor["metadata"]["uid"] = "preemptor"
    # The full form (nodeCacheCapable: false) is read too; the answer is always by UID.
    full = httpx.post(extender + "/preempt", json={"Pod": preemptor, "NodeNameToMetaVictims": None,
                                                   "NodeNameToVictims": {"two-t4": {"Pods": [read_pod(core, "x")],
                                                                                    "NumPDBViolations": 0}}})
    assert full.json()["NodeNameToMetaVictims"]["two-t4"]["Pods"] in ([{"UID": uid["x"]}], [{"UID": uid["y"]}])
    bad = httpx.post(extender + "/preempt", json={"Pod": preemptor})
    assert bad.status_code == 400
    assert "neither NodeNameToMetaVictims" in bad.json()["Error"]


def _on_two_t4(extender: str, proposed_uid: str) -> Any:
    """The extender's victims on "two-t4" for an 8-unit pod of priority 5 (empty while it sees none there)."""
    return (_answer(extender, proposed_uid, "probe").get("NodeNameToMetaVictims") or {}).get("two-t4") or {}


def _answer(extender: str, proposed_uid: str, name: str) -> Any:
    preemptor = admitted(pod_body(name, 8), 5)
    preemptor["metadata"]["uid"] = "preemptor"
    answer = httpx.post(extender + "/preempt", json={"Pod": preemptor, "NodeNameToVictims": None,
                                                     "NodeNameToMetaVictims": {
                                                         "two-t4": {"Pods": [{"UID": proposed_uid}],
                                                                    "NumPDBViolations": 1},
                                                         "unknown-node": {"Pods": [{"UID": "u"}]}}})
    assert answer.status_code == 200
    return answer.json()


def guarded_pair(cluster: LocalCluster, extender: str, core: client.CoreV1Api) -> None:
    """Two equally good single victims on "two-t4"; a budget over "a-serving" allows no disruption, so the
    extender takes "b-batch" (without the budget, names break the tie: "a-serving" would go)."""
    running(core, "a-serving", "two-t4", (0,), 15, 1, labels={"app": "serving"})
    running(core, "b-batch", "two-t4", (1,), 15, 1, labels={"app": "batch"})
    running(core, "mixed-t4", "mixed", (0,), 15, 100)
    running(core, "mixed-v100", "mixed", (1,), 32, 100)
    budget(cluster, "serving", "serving", 0)
    batch = read_pod(core, "b-batch")["metadata"]["uid"]
    wait_for(lambda: _on_two_t4(extender, "none").get("Pods") == [{"UID": batch}], "the extender to see the budget")


def test_preemption_spares_pods_a_disruption_budget_protects(cluster: LocalCluster, extender: str,
                                                             core: client.CoreV1Api) -> None:
    guarded_pair(cluster, extender, core)
    create_pod(core, with_priority(pod_body("urgent", 8), 10))
    with SchedulerLoop(cluster.api_client(), extender, seed=1) as loop:
        schedule_after_preemption(loop, core, "urgent", {"a-serving", "mixed-t4", "mixed-v100"})


def test_a_budget_that_allows_a_disruption_is_no_obstacle(cluster: LocalCluster, extender: str,
                                                          core: client.CoreV1Api) -> None:
    guarded_pair(cluster, extender, core)
    # The disruption controller now allows one: the watch brings the change, and the names decide again.
    client.PolicyV1Api(cluster.api_client()).patch_namespaced_pod_disruption_budget_status(
        "serving", "default", {"status": {"disruptionsAllowed": 1}})
    serving = read_pod(core, "a-serving")["metadata"]["uid"]
    wait_for(lambda: _on_two_t4(extender, "none").get("Pods") == [{"UID": serving}],
             "the extender to see the budget's new status")
    create_pod(core, with_priority(pod_body("urgent", 8), 10))
    with SchedulerLoop(cluster.api_client(), extender, seed=1) as loop:
        schedule_after_preemption(loop, core, "urgent", {"b-batch", "mixed-t4", "mixed-v100"})


def test_the_scheduler_prefers_the_node_whose_victims_no_budget_protects(cluster: LocalCluster, extender: str,
                                                                        core: client.CoreV1Api) -> None:
    # One equally good victim on each node; kube-scheduler's first criterion is the fewest budget violations.
    running(core, "a-guarded", "two-t4", (0,), 15, 1, labels={"app": "guarded"})
    running(core, "two-t4-high", "two-t4", (1,), 15, 100)
    running(core, "b-free", "mixed", (0,), 15, 1, labels={"app": "free"})
    running(core, "mixed-v100", "mixed", (1,), 32, 100)
    budget(cluster, "guarded", "guarded", 0)
    create_pod(core, with_priority(pod_body("urgent", 8, annotations={ANN_GPU_MODEL: T4}), 10))
    with SchedulerLoop(cluster.api_client(), extender, seed=1) as loop:
        node = schedule_after_preemption(loop, core, "urgent", {"a-guarded", "two-t4-high", "mixed-v100"})
    assert node == "mixed"
