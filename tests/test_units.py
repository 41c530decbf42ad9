"""The node's memory unit is the authority: every component reads it from the node, never from its own flag.

A device plugin running with ``--unit MiB`` publishes ``gpushare.io/memory-unit: MiB`` and advertises one device
per MiB; a pod asking for 4096 units there asks for 4 GiB. The extender below is started with its default GiB
and must still place pods on such nodes in MiB, and refuse, with a sentence, nodes whose unit it cannot trust.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from kubernetes import client
from test_extender import Env
from test_extender_harness import T4, T4_MIB, create_pod, gpu_node, pod_body, read_pod, running_extender, spec

from extender.config import ExtenderConfig
from gpushare.contract import ANN_MEMORY_UNIT, RESOURCE_GPU_MEM, MemoryUnit, read_assignment, unit_annotation
from gpushare.kube.convert import node_info, pod_info
from gpushare.localcluster import LocalCluster
from inspect_cli.render import summary
from inspect_cli.report import cluster_report

MERGE_PATCH = "application/merge-patch+json"


def publish(core: client.CoreV1Api, node: str, unit: MemoryUnit | str | None, devices: int) -> None:
    """What a device plugin publishes: its unit (``None``: an old plugin that says nothing) and its devices."""
    annotations: dict[str, Any] = {ANN_MEMORY_UNIT: None}
    if unit is not None:
        annotations = dict(unit_annotation(unit)) if isinstance(unit, MemoryUnit) else {ANN_MEMORY_UNIT: unit}
    core.patch_node(node, {"metadata": {"annotations": annotations}}, _content_type=MERGE_PATCH,
                    _preload_content=False)
    capacity = {RESOURCE_GPU_MEM: str(devices)}
    core.patch_node_status(node, {"status": {"capacity": capacity, "allocatable": capacity}},
                           _content_type=MERGE_PATCH, _preload_content=False)


NODES = ("gib", "mib", "bogus", "bogus-too", "silent-mib", "unsaid")


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(spec(*(gpu_node(name, (T4, T4_MIB)) for name in NODES))) as local:
        core = client.CoreV1Api(local.api_client())
        publish(core, "mib", MemoryUnit.MiB, T4_MIB)
        publish(core, "bogus", "KiB", T4_MIB * 1024)
        publish(core, "bogus-too", "TiB", T4_MIB * 1024)
        publish(core, "silent-mib", None, T4_MIB)
        publish(core, "unsaid", None, 15)  # an older plugin in GiB: nothing contradicts the default
        yield local


@pytest.fixture(scope="module")
def env(cluster: LocalCluster) -> Iterator[Env]:
    with running_extender(cluster, ExtenderConfig()) as url:  # the extender's default unit: GiB
        yield Env(cluster, url)


def test_the_unit_flag_is_the_default_for_nodes_that_do_not_say(cluster: LocalCluster) -> None:
    for default, unsaid_total in ((MemoryUnit.GiB, 15), (MemoryUnit.MiB, None)):
        with running_extender(cluster, ExtenderConfig(unit=default)) as url:
            inspect = Env(cluster, url).inspect
            assert [d["totalGPU"] for d in inspect("mib")["nodes"][0]["devs"]] == [T4_MIB]
            assert [d["totalGPU"] for d in inspect("gib")["nodes"][0]["devs"]] == [15]
            # In MiB the unsaid node's 15 advertised devices contradict its 15360 MiB of GPU: refused, not guessed.
            assert [d["totalGPU"] for d in inspect("unsaid")["nodes"][0]["devs"]] == (
                [unsaid_total] if unsaid_total else [])


def test_a_mib_node_is_scheduled_in_mib_behind_a_gib_extender(env: Env) -> None:
    pod = create_pod(env.core, pod_body("four-gib", 4096))
    body = env.post("filter", {"Pod": pod, "NodeNames": ["gib", "mib"]}).json()
    assert body["NodeNames"] == ["mib"]
    alone = env.post("filter", {"Pod": pod, "NodeNames": ["gib"]}).json()
    assert "gib" in alone["FailedAndUnresolvableNodes"]  # 4096 GiB is larger than any GPU there
    assert env.bind(pod, "mib") == ""
    assignment = read_assignment(pod_info(read_pod(env.core, "four-gib")))
    assert assignment is not None and assignment.unit is MemoryUnit.MiB and assignment.gpu_memory == T4_MIB
    env.settled()
    [gpu] = env.inspect("mib")["nodes"][0]["devs"]
    assert (gpu["totalGPU"], gpu["usedGPU"]) == (T4_MIB, 4096)
    [gpu] = env.inspect("gib")["nodes"][0]["devs"]
    assert (gpu["totalGPU"], gpu["usedGPU"]) == (15, 0)


def test_the_same_request_means_the_nodes_own_unit(env: Env) -> None:
    pod = create_pod(env.core, pod_body("eight", 8))
    body = env.post("filter", {"Pod": pod, "NodeNames": ["gib", "mib"]}).json()
    assert len(body["NodeNames"]) == 1 and body["FailedNodes"] == body["FailedAndUnresolvableNodes"] == {}
    assert env.bind(pod, "gib") == ""
    assignment = read_assignment(pod_info(read_pod(env.core, "eight")))
    assert assignment is not None and assignment.unit is MemoryUnit.GiB and assignment.gpu_memory == 15


@pytest.mark.parametrize(("node", "sentence"), [
    ("bogus", "node(s) say their aliyun.com/gpu-mem devices are in a unit gpushare does not know "
              "(gpushare.io/memory-unit); gpushare knows GiB and MiB"),
    ("silent-mib", "node(s) advertise their GPUs' memory in MiB as aliyun.com/gpu-mem devices, but their "
                   "gpushare.io/memory-unit annotation does not say their unit, so the extender's default GiB applies; "
                   "gpushare refuses to guess"),
])
def test_a_node_whose_unit_cannot_be_trusted_is_refused_with_a_sentence(env: Env, node: str, sentence: str) -> None:
    pod = create_pod(env.core, pod_body(f"small-{node}", 1))
    body = env.post("filter", {"Pod": pod, "NodeNames": [node, "gib"]}).json()
    assert body["NodeNames"] == ["gib"]
    alone = env.post("filter", {"Pod": pod, "NodeNames": [node]}).json()  # no node passes: the reasons are worded
    assert sentence in alone["FailedAndUnresolvableNodes"][node]


def test_nodes_with_the_same_unit_fault_get_one_reason(env: Env) -> None:
    """kube-scheduler counts nodes per distinct reason: a fleet whose plugins publish units gpushare does not know
    must read as one line of the pod's Event, whatever each node says; the log and inspect name the nodes."""
    pod = create_pod(env.core, pod_body("small-fleet", 1))
    reasons = env.post("filter", {"Pod": pod, "NodeNames": ["bogus", "bogus-too"]}).json()["FailedAndUnresolvableNodes"]
    assert reasons["bogus"] == reasons["bogus-too"]
    assert "bogus" not in reasons["bogus"] and "KiB" not in reasons["bogus"]


def test_inspect_reads_each_nodes_unit_and_names_the_refused_ones(env: Env) -> None:
    nodes = [node_info(n) for n in orjson.loads(env.core.list_node(_preload_content=False).data)["items"]]
    listed = env.core.list_pod_for_all_namespaces(_preload_content=False)
    pods = [pod_info(p) for p in orjson.loads(listed.data)["items"]]
    report = cluster_report(nodes, pods)
    by_name = {n.name: n for n in report.nodes}
    assert by_name["mib"].unit is MemoryUnit.MiB and by_name["mib"].total == T4_MIB
    assert by_name["gib"].unit is MemoryUnit.GiB and by_name["gib"].total == 15
    assert report.unit is MemoryUnit.MiB  # mixed units are shown in the smaller one, converted exactly
    assert by_name["bogus"].gpus == () and "'KiB'" in str(by_name["bogus"].defect)
    text = summary(report)
    assert "gpushare knows GiB and MiB" in text and "refuses to guess" in text
