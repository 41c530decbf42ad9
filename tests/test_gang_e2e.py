"""Gangs end to end: the local API server (with and without the PodGroup CRD), the extender over HTTP, and the
scheduler loop driving it as kube-scheduler does (serial cycles, background binds, backoff and retries)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

import httpx
import orjson
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from test_extender_ha import replica, settled_leader
from test_extender_harness import (
    T4,
    T4_MIB,
    create_pod,
    emptied_core,
    gpu_node,
    pod_body,
    read_pod,
    running_extender,
    serve,
    spec,
    wait_for,
)

from extender.app import create_app
from extender.config import ExtenderConfig
from gpushare.contract import (
    ANN_GROUP_MIN_MEMBER,
    KUBESHARE_GROUP_HEADCOUNT,
    KUBESHARE_GROUP_NAME,
    KUBESHARE_GROUP_THRESHOLD,
    LABEL_POD_GROUP,
    Assignment,
    MemoryUnit,
)
from gpushare.kube.api import Kube, PodGroups
from gpushare.localcluster import LocalCluster
from gpushare.localcluster.scheduler import SchedulerLoop

# Two nodes of two 15-GiB T4s: four GPUs, and a 15-unit pod takes one whole.
CLUSTER = spec(gpu_node("left", (T4, T4_MIB), (T4, T4_MIB), cpu="8"),
               gpu_node("right", (T4, T4_MIB), (T4, T4_MIB), cpu="8"))
NODES = ["left", "right"]
# Above the scheduler loop's longest backoff (10 s), so that a plan made while a member backs off is not released
# before that member's retry; the timeout tests use their own.
GANG_TIMEOUT_S = 20.0
# Retries back off up to 10 s in the scheduler loop, as in kube-scheduler: a gang completes within a few of them.
SETTLE_S = 45.0
PG = ("scheduling.x-k8s.io", "v1alpha1", "default", "podgroups")


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(CLUSTER) as local:
        # The Priority admission plugin sets spec.priority from a pod's class, and only from it.
        client.SchedulingV1Api(local.api_client()).create_priority_class({"metadata": {"name": "high"},
                                                                          "value": 100})
        yield local


@pytest.fixture(scope="module")
def extender(cluster: LocalCluster) -> Iterator[str]:
    with running_extender(cluster, ExtenderConfig(policy="binpack", gang_timeout_s=GANG_TIMEOUT_S)) as url:
        yield url + "/gpushare-scheduler"


@pytest.fixture
def core(cluster: LocalCluster, extender: str) -> client.CoreV1Api:
    api = emptied_core(cluster)
    client.CustomObjectsApi(cluster.api_client()).delete_collection_namespaced_custom_object(*PG)
    # The extender's watch has seen the deletions: each test starts from empty GPUs.
    wait_for(lambda: metric(extender, "gpushare_extender_gpu_memory_allocated") == 0, "the extender's cache to empty")
    return api


@pytest.fixture
def loop(cluster: LocalCluster, extender: str, core: client.CoreV1Api) -> Iterator[SchedulerLoop]:
    with SchedulerLoop(cluster.api_client(), extender, seed=3) as scheduler:
        scheduler.start()
        yield scheduler


def member(name: str, gang: str, units: int = 15, min_member: int | None = None,
           labels: dict[str, str] | None = None) -> dict[str, Any]:
    annotations = {} if min_member is None else {ANN_GROUP_MIN_MEMBER: str(min_member)}
    body = pod_body(name, units, annotations=annotations)
    body["metadata"]["labels"] = labels if labels is not None else {LABEL_POD_GROUP: gang}
    return body


def blocker(core: client.CoreV1Api, name: str, node: str, gpu: int, units: int = 15) -> str:
    """A pod already placed by gpushare on one GPU, as after a bind; its UID."""
    assignment = Assignment(gpu_indices=(gpu,), total=units, gpu_memory=15, assume_time_ns=1, unit=MemoryUnit.GiB,
                            assigned=True)
    created = create_pod(core, pod_body(name, units, node=node, extra_annotations=assignment.annotations()))
    uid: str = created["metadata"]["uid"]
    return uid


def bound(core: client.CoreV1Api, *names: str) -> set[str]:
    return {n for n in names if read_pod(core, n)["spec"].get("nodeName")}


def messages(core: client.CoreV1Api, pod: str, reason: str) -> list[str]:
    listed: Any = core.list_namespaced_event("default", _preload_content=False)
    return [e["message"] for e in orjson.loads(listed.data)["items"]
            if e["involvedObject"]["name"] == pod and e["reason"] == reason]


def filter_pod(extender: str, core: client.CoreV1Api, name: str, nodes: list[str] = NODES) -> dict[str, Any]:
    """kube-scheduler's filter call for the pod as the API server has it."""
    answer = httpx.post(extender + "/filter", json={"Pod": read_pod(core, name), "Nodes": None, "NodeNames": nodes})
    assert answer.status_code == 200
    result: dict[str, Any] = answer.json()
    return result


def bind_pod(extender: str, core: client.CoreV1Api, name: str, node: str) -> str:
    pod = read_pod(core, name)
    answer = httpx.post(extender + "/bind", json={"PodName": name, "PodNamespace": "default",
                                                  "PodUID": pod["metadata"]["uid"], "Node": node})
    assert answer.status_code == 200
    error: str = answer.json()["Error"]
    return error


def failures(result: dict[str, Any]) -> set[str]:
    """A gang's refusals: unresolvable, since no eviction helps a gang (kube-scheduler then skips preemption)."""
    assert not result["FailedNodes"], result
    return set(result["FailedAndUnresolvableNodes"].values())


def metric(extender: str, name: str) -> float:
    text = httpx.get(extender.removesuffix("/gpushare-scheduler") + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_a_gang_waits_for_its_last_member_then_all_bind(core: client.CoreV1Api, loop: SchedulerLoop) -> None:
    for name in ("w0", "w1"):
        create_pod(core, member(name, "train", min_member=3))
    wait_for(lambda: any("gang default/train: 2 of 3 members exist; waiting for 1 more" in m
                         for n in ("w0", "w1") for m in messages(core, n, "FailedScheduling")),
             "the first members to be told to wait", SETTLE_S)
    assert bound(core, "w0", "w1") == set()
    create_pod(core, member("w2", "train", min_member=3))
    wait_for(lambda: bound(core, "w0", "w1", "w2") == {"w0", "w1", "w2"}, "the whole gang to bind", SETTLE_S)


def test_a_gang_that_fits_only_in_part_binds_nobody_until_it_fits(core: client.CoreV1Api,
                                                                  loop: SchedulerLoop) -> None:
    blocker(core, "busy-a", "left", 0)
    blocker(core, "busy-b", "right", 1)
    for name in ("p0", "p1", "p2"):
        create_pod(core, member(name, "part", min_member=3))
    # Each member alone fits (two GPUs are free), so a pod-at-a-time scheduler would bind two of them.
    wait_for(lambda: all(messages(core, n, "FailedScheduling") for n in ("p0", "p1", "p2")),
             "every member to be tried", SETTLE_S)
    assert bound(core, "p0", "p1", "p2") == set()
    assert "gang default/part: 2 of the 3 members it still needs fit the cluster at once; nothing is held" in (
        " ".join(messages(core, "p2", "FailedScheduling")))
    core.delete_namespaced_pod("busy-a", "default", grace_period_seconds=0)
    wait_for(lambda: bound(core, "p0", "p1", "p2") == {"p0", "p1", "p2"}, "the gang once room appears", SETTLE_S)


def test_two_gangs_competing_for_the_same_gpus_never_both_hold_and_one_completes(
        core: client.CoreV1Api, loop: SchedulerLoop) -> None:
    # Each gang needs three of the four GPUs; members arrive interleaved.
    gangs = {"red": ["red-0", "red-1", "red-2"], "blue": ["blue-0", "blue-1", "blue-2"]}
    for red, blue in zip(gangs["red"], gangs["blue"], strict=True):
        create_pod(core, member(red, "red", min_member=3))
        create_pod(core, member(blue, "blue", min_member=3))

    def one_gang_bound() -> bool:
        return any(bound(core, *names) == set(names) for names in gangs.values())

    wait_for(one_gang_bound, "one gang to bind whole", SETTLE_S)
    winner = next(g for g, names in gangs.items() if bound(core, *names) == set(names))
    loser = "blue" if winner == "red" else "red"
    # The loser held nothing and bound nothing: it failed whole, with a sentence.
    wait_for(lambda: any(f"gang default/{loser}: 1 of the 3 members" in m for n in gangs[loser]
                         for m in messages(core, n, "FailedScheduling")), "the loser to be told it does not fit",
             SETTLE_S)
    assert bound(core, *gangs[loser]) == set()
    for name in gangs[winner]:
        core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    wait_for(lambda: bound(core, *gangs[loser]) == set(gangs[loser]), "the other gang once the first is gone",
             SETTLE_S)


def test_a_gang_of_different_shapes_spans_nodes(core: client.CoreV1Api, loop: SchedulerLoop) -> None:
    # Every GPU is needed: the 2-GPU member takes a whole node, the two 1-GPU members the other.
    big = member("shape-big", "shapes", units=30, min_member=3)
    big["metadata"]["annotations"]["gpushare.io/gpu-count"] = "2"
    create_pod(core, member("shape-s0", "shapes", min_member=3))
    create_pod(core, big)
    create_pod(core, member("shape-s1", "shapes", min_member=3))
    names = ("shape-big", "shape-s0", "shape-s1")
    wait_for(lambda: bound(core, *names) == set(names), "the mixed gang to bind", SETTLE_S)
    pods = {n: read_pod(core, n) for n in names}
    assert pods["shape-big"]["metadata"]["annotations"]["gpushare.io/gpu-indices"] == "0,1"
    assert pods["shape-s0"]["spec"]["nodeName"] == pods["shape-s1"]["spec"]["nodeName"] != (
        pods["shape-big"]["spec"]["nodeName"])


def test_interleaved_filters_of_two_gangs_hold_one_gang_whole_and_nothing_of_the_other(
        extender: str, core: client.CoreV1Api) -> None:
    # kube-scheduler's order, pod by pod: red and blue alternate, each needing three of the four GPUs.
    for i in range(3):
        create_pod(core, member(f"r{i}", "r", min_member=3))
        create_pod(core, member(f"b{i}", "b", min_member=3))
    wait_for(lambda: bool(filter_pod(extender, core, "r0")["NodeNames"]), "red's plan once the watch shows all")
    assert metric(extender, "gpushare_extender_gang_held_pods") == 3
    for name in ("b0", "b1", "b2"):
        assert failures(filter_pod(extender, core, name)) == {
            "gang default/b: 1 of the 3 members it still needs fit the cluster at once; nothing is held for it, and "
            "it waits for capacity"}
    assert metric(extender, "gpushare_extender_gang_held_pods") == 3  # still only red's
    assert metric(extender, "gpushare_extender_gangs_waiting") == 1  # blue
    for name in ("r0", "r1", "r2"):
        [node] = filter_pod(extender, core, name)["NodeNames"]
        assert bind_pod(extender, core, name, node) == ""
    wait_for(lambda: metric(extender, "gpushare_extender_gang_held_pods") == 0, "the watch to confirm red's binds")


def test_with_two_replicas_the_follower_plans_and_the_leader_binds(cluster: LocalCluster,
                                                                   core: client.CoreV1Api) -> None:
    with ExitStack() as stack:
        urls = [stack.enter_context(replica(cluster, f"gang-{i}")) for i in range(2)]
        leader = settled_leader(urls)
        follower = next(u for u in urls if u != leader) + "/gpushare-scheduler"
        for name in ("h0", "h1"):
            create_pod(core, member(name, "ha", min_member=2))
        wait_for(lambda: bool(filter_pod(follower, core, "h0")["NodeNames"]), "the follower's plan")
        for name in ("h0", "h1"):  # each bind is forwarded to the leader, which binds on the planned node
            [node] = filter_pod(follower, core, name)["NodeNames"]
            assert bind_pod(follower, core, name, node) == ""
            assert read_pod(core, name)["spec"]["nodeName"] == node
        # The follower's holds give way to what the leader bound, whichever GPUs it chose there.
        wait_for(lambda: metric(follower, "gpushare_extender_gang_held_pods") == 0, "the follower's watch")
        assert metric(follower, "gpushare_extender_reservations") == 0


@pytest.fixture
def impatient(cluster: LocalCluster) -> Iterator[str]:
    """An extender of its own with a short --gang-timeout, long enough for the checks made while a plan holds."""
    with running_extender(cluster, ExtenderConfig(policy="binpack", gang_timeout_s=3.0)) as url:
        yield url + "/gpushare-scheduler"


def test_a_plan_not_bound_within_its_timeout_is_released_with_an_event(impatient: str,
                                                                       core: client.CoreV1Api) -> None:
    extender = impatient
    for name in ("t0", "t1"):
        create_pod(core, member(name, "slow", min_member=2))
    wait_for(lambda: bool(filter_pod(extender, core, "t0")["NodeNames"]), "the plan (once the watch shows both)")
    first = filter_pod(extender, core, "t0")["NodeNames"]
    held = filter_pod(extender, core, "t1")["NodeNames"]
    assert len(first) == 1 and held == first  # binpack plans both on one node; each passes only its own
    assert bind_pod(extender, core, "t0", first[0]) == ""
    # t1's GPU stays held until t1 binds or time runs out; t0's hold ends once the watch shows t0 bound.
    wait_for(lambda: metric(extender, "gpushare_extender_gang_held_pods") == 1, "t0's hold to end with its bind")
    create_pod(core, pod_body("solo", 15))
    assert filter_pod(extender, core, "solo", held)["NodeNames"] == []  # t1's GPU is held
    # t1 never binds (as when kube-scheduler's own checks keep failing it there): the plan times out.
    wait_for(lambda: bool(messages(core, "t1", "GPUShareGangTimeout")), "the plan's timeout", 10)
    message = messages(core, "t1", "GPUShareGangTimeout")[0]
    assert message.startswith("gang default/slow: 1 of its members were not bound within 3 s of its plan (1 were)")
    assert metric(extender, "gpushare_extender_gang_held_pods") == 0
    assert metric(extender, 'gpushare_extender_gang_plans_total{result="released"}') >= 1
    assert filter_pod(extender, core, "solo", held)["NodeNames"] == held  # the released GPU is free for others
    # t0 stays bound, and counts: t1 alone is planned again, as the one member the gang still needs.
    assert read_pod(core, "t0")["spec"].get("nodeName")
    assert len(filter_pod(extender, core, "t1")["NodeNames"]) == 1


def test_a_podgroup_sets_the_minimum_and_members_bound_before_a_restart_count(
        cluster: LocalCluster, extender: str, core: client.CoreV1Api) -> None:
    groups = client.CustomObjectsApi(cluster.api_client())
    groups.create_namespaced_custom_object(*PG, {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                                                  "metadata": {"name": "crd"}, "spec": {"minMember": 3}})
    # One member already runs (an extender restart lost every hold, the watch still shows it bound); the pods
    # carry an annotation that the PodGroup overrides.
    running = member("c0", "crd", min_member=1)
    running["spec"]["nodeName"] = "left"
    running["metadata"]["annotations"].update(Assignment(gpu_indices=(0,), total=15, gpu_memory=15, assume_time_ns=1,
                                                         unit=MemoryUnit.GiB, assigned=True).annotations())
    create_pod(core, running)
    create_pod(core, member("c1", "crd", min_member=1))
    wait_for(lambda: failures(filter_pod(extender, core, "c1")) == {
        "gang default/crd: 2 of 3 members exist; waiting for 1 more"}, "the gang to wait for its third member")
    create_pod(core, member("c2", "crd", min_member=1))
    wait_for(lambda: bool(filter_pod(extender, core, "c1")["NodeNames"]), "the plan")
    planned = filter_pod(extender, core, "c1")
    assert len(planned["NodeNames"]) == 1  # two members needed, c0 counts as placed
    ranks = httpx.post(extender + "/prioritize", json={"Pod": read_pod(core, "c1"), "Nodes": None,
                                                       "NodeNames": NODES}).json()
    assert {h["Host"]: h["Score"] for h in ranks}[planned["NodeNames"][0]] == 10
    assert bind_pod(extender, core, "c1", planned["NodeNames"][0]) == ""
    other = filter_pod(extender, core, "c2")
    assert bind_pod(extender, core, "c2", other["NodeNames"][0]) == ""
    pods = [read_pod(core, n) for n in ("c0", "c1", "c2")]
    used = {(p["spec"]["nodeName"], p["metadata"]["annotations"]["gpushare.io/gpu-indices"]) for p in pods}
    assert len(used) == 3  # three different GPUs


def test_a_podgroup_timeout_overrides_the_extender_default(cluster: LocalCluster, extender: str,
                                                          core: client.CoreV1Api) -> None:
    client.CustomObjectsApi(cluster.api_client()).create_namespaced_custom_object(*PG, {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": "brief"},
        "spec": {"minMember": 2, "scheduleTimeoutSeconds": 1}})
    for name in ("b0", "b1"):
        create_pod(core, member(name, "brief"))
    wait_for(lambda: bool(filter_pod(extender, core, "b0")["NodeNames"]), "the plan")
    wait_for(lambda: bool(messages(core, "b1", "GPUShareGangTimeout")), "the PodGroup's timeout", 10)
    assert "were not bound within 1 s of its plan (0 were)" in messages(core, "b1", "GPUShareGangTimeout")[0]
    assert messages(core, "b0", "GPUShareGangTimeout")  # b0 never bound either


def test_a_member_without_gpus_is_left_to_kube_scheduler_and_counts(extender: str, core: client.CoreV1Api) -> None:
    # An MPI-style gang: a launcher asking for no GPU (kube-scheduler places it without the extender) and two
    # GPU workers; the workers need not wait for the launcher's bind.
    create_pod(core, member("launcher", "mpi", units=0, min_member=3))
    for name in ("worker-0", "worker-1"):
        create_pod(core, member(name, "mpi", min_member=3))
    wait_for(lambda: len(filter_pod(extender, core, "worker-0")["NodeNames"]) == 1, "the workers' plan")
    assert len(filter_pod(extender, core, "worker-1")["NodeNames"]) == 1


def test_without_a_podgroup_the_annotation_decides(extender: str, core: client.CoreV1Api) -> None:
    create_pod(core, member("a0", "no-group", min_member=2))
    assert failures(filter_pod(extender, core, "a0")) == {
        "gang default/no-group: 1 of 2 members exist; waiting for 1 more"}
    create_pod(core, member("a1", "nothing-says"))
    error = filter_pod(extender, core, "a1")["Error"]
    assert "PodGroup default/nothing-says, which does not exist" in error and ANN_GROUP_MIN_MEMBER in error


def test_kubeshare_labels_start_the_threshold_of_the_headcount(core: client.CoreV1Api, loop: SchedulerLoop) -> None:
    labels = {KUBESHARE_GROUP_NAME: "ks", KUBESHARE_GROUP_HEADCOUNT: "4", KUBESHARE_GROUP_THRESHOLD: "0.5"}
    create_pod(core, member("k0", "", labels=labels))
    wait_for(lambda: any("gang default/ks: 1 of 2 members exist" in m
                         for m in messages(core, "k0", "FailedScheduling")),
             "the first member to be told to wait", SETTLE_S)
    create_pod(core, member("k1", "", labels=labels))
    wait_for(lambda: bound(core, "k0", "k1") == {"k0", "k1"}, "half the headcount to bind", SETTLE_S)


def test_bad_gang_values_fail_the_filter_with_the_field_named(extender: str, core: client.CoreV1Api) -> None:
    create_pod(core, member("bad", "", labels={KUBESHARE_GROUP_NAME: "ks", KUBESHARE_GROUP_HEADCOUNT: "4",
                                                KUBESHARE_GROUP_THRESHOLD: "2"}))
    error = filter_pod(extender, core, "bad")["Error"]
    assert "sharedgpu/group_threshold='2'; use a fraction of the group's headcount above 0 and at most 1" in error


def test_a_gang_member_never_preempts(extender: str, core: client.CoreV1Api) -> None:
    victims = [blocker(core, "low-0", "left", 0), blocker(core, "low-1", "left", 1)]
    proposed = {"left": {"Pods": [{"UID": uid} for uid in victims], "NumPDBViolations": 0}}
    alone = pod_body("alone", 15)
    alone["spec"]["priorityClassName"] = "high"
    create_pod(core, alone)
    gang = member("urgent-member", "pre", min_member=2)
    gang["spec"]["priorityClassName"] = "high"
    create_pod(core, gang)
    for name, evicts in (("alone", True), ("urgent-member", False)):
        answer = httpx.post(extender + "/preempt", json={"Pod": read_pod(core, name), "NodeNameToVictims": None,
                                                         "NodeNameToMetaVictims": proposed}).json()
        assert bool(answer["NodeNameToMetaVictims"]) is evicts, (name, answer)


@pytest.mark.parametrize(("spec_fields", "detail"), [
    ({"minMember": -1}, "spec.minMember in body should be greater than or equal to 0"),
    ({"minMember": "three"}, 'spec.minMember in body must be of type integer: "string"'),
    ({"minMember": 2, "scheduleTimeoutSeconds": 1.5}, 'spec.scheduleTimeoutSeconds in body must be of type integer'),
])
def test_the_local_cluster_validates_podgroups_like_the_crd(cluster: LocalCluster, spec_fields: dict[str, Any],
                                                            detail: str) -> None:
    groups = client.CustomObjectsApi(cluster.api_client())
    with pytest.raises(ApiException) as caught:
        groups.create_namespaced_custom_object(*PG, {"apiVersion": "scheduling.x-k8s.io/v1alpha1",
                                                      "kind": "PodGroup", "metadata": {"name": "bad"},
                                                      "spec": spec_fields})
    assert caught.value.status == 422
    assert detail in orjson.loads(caught.value.body)["message"]


def test_without_the_crd_podgroups_are_not_served_and_the_annotation_decides() -> None:
    with LocalCluster(CLUSTER, crds=()) as plain, running_extender(plain, ExtenderConfig(policy="binpack")) as url:
        groups = client.CustomObjectsApi(plain.api_client())
        with pytest.raises(ApiException) as caught:
            groups.get_namespaced_custom_object(*PG, "anything")
        assert caught.value.status == 404
        apis = httpx.get(plain.url + "/apis").json()
        assert "scheduling.x-k8s.io" not in {g["name"] for g in apis["groups"]}
        core = client.CoreV1Api(plain.api_client())
        create_pod(core, member("lone", "no-crd", min_member=2))
        assert failures(filter_pod(url + "/gpushare-scheduler", core, "lone")) == {
            "gang default/no-crd: 1 of 2 members exist; waiting for 1 more"}


class HeldPodGroups(PodGroups):
    """PodGroup reads that wait until the test lets them go, as against an API server that is slow to answer."""

    def __init__(self, api_client: client.ApiClient) -> None:
        super().__init__(api_client)
        self.entered = threading.Event()
        self.release = threading.Event()

    def read(self, namespace: str, name: str, *, timeout_s: float = 10.0) -> dict[str, Any]:
        self.entered.set()
        self.release.wait(30)
        return super().read(namespace, name, timeout_s=timeout_s)


def test_a_gang_members_filter_leaves_the_event_loop_free(cluster: LocalCluster, core: client.CoreV1Api) -> None:
    api_client = cluster.api_client()
    groups = HeldPodGroups(api_client)
    app = create_app(ExtenderConfig(policy="binpack"), dataclasses.replace(Kube.from_api_client(api_client),
                                                                           pod_groups=groups))
    create_pod(core, member("slow-read", "slow-read-gang"))
    with serve(app) as url, ThreadPoolExecutor(1) as pool:
        wait_for(lambda: httpx.get(url + "/readyz").status_code == 200, "the extender to be ready")
        pending = pool.submit(filter_pod, url + "/gpushare-scheduler", core, "slow-read")
        assert groups.entered.wait(10), "the member's filter never read its PodGroup"
        try:
            # The PodGroup read is still waiting: health and a plain pod's filter answer meanwhile.
            assert httpx.get(url + "/healthz", timeout=5).status_code == 200
            create_pod(core, pod_body("plain", 4))
            assert filter_pod(url + "/gpushare-scheduler", core, "plain")["NodeNames"]
        finally:
            groups.release.set()
        assert "PodGroup" in pending.result(timeout=30)["Error"]


class BrokenPodGroups(PodGroups):
    """PodGroup reads that fail in a way no handler expects, as a bug would."""

    def read(self, namespace: str, name: str, *, timeout_s: float = 10.0) -> dict[str, Any]:
        raise RuntimeError("a bug in the PodGroup read")


def test_a_verb_that_fails_unexpectedly_answers_500_and_the_extender_goes_on(cluster: LocalCluster,
                                                                             core: client.CoreV1Api) -> None:
    api_client = cluster.api_client()
    app = create_app(ExtenderConfig(policy="binpack"), dataclasses.replace(Kube.from_api_client(api_client),
                                                                           pod_groups=BrokenPodGroups(api_client)))
    create_pod(core, member("broken-read", "broken-read-gang"))
    create_pod(core, pod_body("plain-after", 4))
    with serve(app) as url:
        wait_for(lambda: httpx.get(url + "/readyz").status_code == 200, "the extender to be ready")
        answer = httpx.post(url + "/gpushare-scheduler/filter", timeout=10,
                            json={"Pod": read_pod(core, "broken-read"), "Nodes": None, "NodeNames": NODES})
        assert answer.status_code == 500
        assert "failed to answer /gpushare-scheduler/filter" in answer.json()["Error"]
        assert filter_pod(url + "/gpushare-scheduler", core, "plain-after")["NodeNames"]
