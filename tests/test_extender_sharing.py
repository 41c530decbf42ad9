"""GPU affinity, anti-affinity and exclusion end to end: the local API server, the extender over HTTP and the
scheduler loop; where each pod lands is read from the annotations bind wrote."""

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
from gpushare.contract import (
    ANN_AFFINITY,
    ANN_ANTI_AFFINITY,
    ANN_EXCLUSION,
    ANN_GPU_INDICES,
    KUBESHARE_AFFINITY,
    KUBESHARE_EXCLUSION,
    Assignment,
    MemoryUnit,
)
from gpushare.localcluster import LocalCluster
from gpushare.localcluster.scheduler import SchedulerLoop

CLUSTER = spec(gpu_node("left", (T4, T4_MIB), (T4, T4_MIB)), gpu_node("right", (T4, T4_MIB), (T4, T4_MIB)))


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(CLUSTER) as local:
        yield local


@pytest.fixture(scope="module")
def extender(cluster: LocalCluster) -> Iterator[str]:
    # binpack stacks pods on the tightest GPU, so every separation below is the sharing rules' doing
    with running_extender(cluster, ExtenderConfig(policy="binpack")) as url:
        yield url + "/gpushare-scheduler"


@pytest.fixture
def core(cluster: LocalCluster) -> client.CoreV1Api:
    return emptied_core(cluster)


def make(core: client.CoreV1Api, name: str, units: int, annotations: dict[str, str] | None = None,
         labels: dict[str, str] | None = None) -> dict[str, Any]:
    body = pod_body(name, units, annotations=annotations)
    body["metadata"]["labels"] = labels or {}
    return create_pod(core, body)


def gpu_of(core: client.CoreV1Api, name: str) -> tuple[str, str]:
    """(node, GPU indices) as bind recorded them on the pod."""
    pod = read_pod(core, name)
    return pod["spec"]["nodeName"], pod["metadata"]["annotations"][ANN_GPU_INDICES]


def schedule(loop: SchedulerLoop, core: client.CoreV1Api, name: str) -> tuple[str, str]:
    result = loop.schedule_pod(name)
    assert result.scheduled, result.message
    return gpu_of(core, name)


def test_an_affinity_group_shares_one_gpu_and_keeps_other_groups_off_it(cluster: LocalCluster, extender: str,
                                                                        core: client.CoreV1Api) -> None:
    make(core, "red-1", 4, {ANN_AFFINITY: "red"})
    make(core, "blue-1", 4, labels={KUBESHARE_AFFINITY: "blue"})  # KubeShare 2.0 style: a label
    make(core, "red-2", 4, {KUBESHARE_AFFINITY: "red"})  # KubeShare 1.0 style: an annotation
    make(core, "plain", 4)
    make(core, "red-3", 8, {ANN_AFFINITY: "red"})
    with SchedulerLoop(cluster.api_client(), extender, seed=1) as loop:
        red = schedule(loop, core, "red-1")
        assert schedule(loop, core, "blue-1") != red  # binpack alone would stack it on red's GPU
        assert schedule(loop, core, "red-2") == red
        assert schedule(loop, core, "plain") == red  # a pod without a group may join one: the tightest GPU
        # red's GPU has 3 units left and is the only one red's pods may take.
        failed = loop.schedule_pod("red-3")
    assert not failed.scheduled
    assert f"pods of {ANN_AFFINITY}=red already hold GPUs on node(s) {red[0]}, and the pod may only join them" in (
        failed.message)
    assert "1 node(s) have 0 GPU(s) the pod may share, it needs 1" in failed.message


def test_anti_affinity_spreads_and_exclusion_keeps_gpus_apart(cluster: LocalCluster, extender: str,
                                                             core: client.CoreV1Api) -> None:
    for name in ("solo-1", "solo-2", "solo-3"):
        make(core, name, 2, {ANN_ANTI_AFFINITY: "solo"})
    make(core, "x-1", 2, {ANN_EXCLUSION: "x"})
    make(core, "plain", 2)
    make(core, "x-2", 2, labels={KUBESHARE_EXCLUSION: "x"})
    make(core, "y-1", 2, {ANN_EXCLUSION: "y"})
    with SchedulerLoop(cluster.api_client(), extender, seed=1) as loop:
        solos = {schedule(loop, core, name) for name in ("solo-1", "solo-2", "solo-3")}
        assert len(solos) == 3  # three different GPUs, though each had room for all three
        x = schedule(loop, core, "x-1")
        assert x not in solos  # the solo pods' GPUs hold pods without an exclusion value
        assert schedule(loop, core, "plain") != x
        assert schedule(loop, core, "x-2") == x  # binpack's tightest GPU that x may use
        failed = loop.schedule_pod("y-1")  # every GPU is taken by pods of no exclusion, or of x
    assert not failed.scheduled
    assert f"because it holds pods without {ANN_EXCLUSION}=y" in failed.message


def test_malformed_sharing_values_answer_filter_with_the_sentence(cluster: LocalCluster, extender: str,
                                                                  core: client.CoreV1Api) -> None:
    pod = make(core, "bad", 2, {ANN_ANTI_AFFINITY: "not a value"})
    answer = httpx.post(extender + "/filter", content=orjson.dumps({"Pod": pod, "NodeNames": ["left", "right"]}))
    assert answer.status_code == 200
    assert answer.json()["Error"] == (
        f"Pod default/bad has {ANN_ANTI_AFFINITY}='not a value'; use 1 to 63 letters, digits, '-', '_' or '.', "
        "starting and ending with a letter or digit (a Kubernetes label value).")


def running(core: client.CoreV1Api, name: str, node: str, gpu: int, units: int,
            annotations: dict[str, str] | None = None) -> str:
    """A pod of the default priority (0) already placed by gpushare on one GPU, as after a bind; its UID."""
    assignment = Assignment(gpu_indices=(gpu,), total=units, gpu_memory=15, assume_time_ns=1, unit=MemoryUnit.GiB,
                            assigned=True)
    body = pod_body(name, units, node=node, annotations=annotations, extra_annotations=assignment.annotations())
    return str(create_pod(core, body)["metadata"]["uid"])


def test_preempt_answers_with_the_victims_the_sharing_rules_need(cluster: LocalCluster, extender: str,
                                                                 core: client.CoreV1Api) -> None:
    uids = {
        "x-pod": running(core, "x-pod", "left", 0, 4, {ANN_EXCLUSION: "x"}),
        "plain-a": running(core, "plain-a", "left", 1, 5),
        "plain-b": running(core, "plain-b", "left", 1, 5),
        "plain-c": running(core, "plain-c", "left", 1, 4),
        "red-a": running(core, "red-a", "right", 0, 8, {ANN_AFFINITY: "red"}),
        "filler": running(core, "filler", "right", 0, 7),
        "full": running(core, "full", "right", 1, 15),
    }
    wait_for(lambda: sum(len(d["pods"]) for n in httpx.get(extender + "/inspect").json()["nodes"]
                         for d in n["devs"]) == len(uids), "the extender to see every pod")

    def preempt(name: str, units: int, annotations: dict[str, str] | None = None) -> dict[str, list[str]]:
        pod = make(core, name, units, annotations)
        pod["spec"]["priority"] = 10  # as admission sets it from a PriorityClass; the pods above have 0
        # kube-scheduler's own dry run counts memory per node: say it proposed plain-a on left, full on right.
        victims = {"left": {"Pods": [{"UID": uids["plain-a"]}], "NumPDBViolations": 0},
                   "right": {"Pods": [{"UID": uids["full"]}], "NumPDBViolations": 0}}
        answer = httpx.post(extender + "/preempt",
                            content=orjson.dumps({"Pod": pod, "NodeNameToMetaVictims": victims}))
        assert answer.status_code == 200
        found = answer.json()["NodeNameToMetaVictims"]
        return {node: [p["UID"] for p in chosen["Pods"]] for node, chosen in found.items()}

    # A plain pod of 8: left's GPU 0 has 11 units free, but only for pods of exclusion x: evicting its one pod
    # beats two of GPU 1's three. On right, room for 8 means evicting full, whose GPU the pod may then take.
    assert preempt("plain", 8) == {"left": [uids["x-pod"]], "right": [uids["full"]]}
    # A pod of red must join red's GPU on right: filler goes, never red-a; left, without red, is no candidate.
    assert preempt("red", 6, {ANN_AFFINITY: "red"}) == {"right": [uids["filler"]]}
