"""End to end: scheduler loop -> real extender (HTTP) -> bind -> simulated kubelet -> device plugin (gRPC).

The node starts bare (no GPU resources); the plugin publishes its inventory and the kubelet its capacity, the
extender places pods from what they published, and every container ends up on the GPU its annotations name.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import driver_gpus, with_driver
from test_extender_harness import running_extender
from test_kubelet import NODE, UUIDS, Rig, eventually, rig

from deviceplugin.devices import uuid_of
from deviceplugin.isolation import Isolation, IsolationConfig
from deviceplugin.nvml import NvmlBackend
from gpushare.contract import (
    ANN_AFFINITY,
    ANN_ASSIGNED,
    ANN_COMPUTE,
    ANN_COMPUTE_LIMIT,
    ANN_GPU_INDICES,
    ANN_NODE_INVENTORY,
    ANN_POD,
    KUBESHARE_GPU_LIMIT,
    KUBESHARE_GPU_REQUEST,
    RESOURCE_GPU_MEM,
    decode_inventory,
)
from gpushare.localcluster.scheduler import SchedulerLoop


@pytest.fixture
def scheduled() -> Iterator[Rig]:
    with rig() as node:
        eventually(lambda: ANN_NODE_INVENTORY in node.node()["metadata"]["annotations"]
                   and node.node()["status"]["allocatable"].get(RESOURCE_GPU_MEM) == "72", "the node's GPUs")
        with running_extender(node.cluster) as url, SchedulerLoop(node.cluster.api_client(),
                                                                  url + "/gpushare-scheduler") as loop:
            loop.start()
            yield node


def test_pods_placed_by_the_extender_run_on_the_gpus_their_annotations_name(scheduled: Rig) -> None:
    scheduled.create("big", {"c": 30})
    scheduled.create("pair", {"train": 6, "side": 2})
    scheduled.create("wide", {"c": 16}, gpu_count=2)
    for name in ("big", "pair", "wide"):
        pod = scheduled.running(name)
        annotations = pod["metadata"]["annotations"]
        assert pod["spec"]["nodeName"] == NODE and annotations[ANN_ASSIGNED] == "true"
        expected = ",".join(UUIDS[int(i)] for i in annotations[ANN_GPU_INDICES].split(","))
        for env in scheduled.kubelet.allocations[f"default/{name}"].values():
            assert env["NVIDIA_VISIBLE_DEVICES"] == expected
    assert scheduled.pod("big")["metadata"]["annotations"][ANN_GPU_INDICES] == "2"  # only the A100 holds 30 GiB


@pytest.mark.parametrize(("mode", "variable"), [(Isolation.HAMI_CORE, "CUDA_DEVICE_SM_LIMIT"),
                                                (Isolation.MPS, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")])
def test_the_compute_limit_reaches_the_container_as_its_ceiling(mode: Isolation, variable: str) -> None:
    isolation = IsolationConfig(mode, hami_library="/host/libvgpu.so", hami_preload="/host/preload",
                                mps_pipe_dir="/host/mps")
    with rig(isolation=isolation) as node:
        eventually(lambda: node.node()["status"]["allocatable"].get(RESOURCE_GPU_MEM) == "72", "the node's GPUs")
        with running_extender(node.cluster) as url, SchedulerLoop(node.cluster.api_client(),
                                                                  url + "/gpushare-scheduler") as loop:
            loop.start()
            # Distinct sizes: Allocate names no pod, and same-size pods bound at the same instant may be told
            # apart in the other order than the kubelet admits them (docs/device-plugin.md).
            node.create("burst", {"c": 4}, annotations={ANN_COMPUTE: "30", ANN_COMPUTE_LIMIT: "80"})
            node.create("steady", {"c": 5}, annotations={ANN_COMPUTE: "20"})
            node.core.create_namespaced_pod("default", {
                "metadata": {"name": "kubeshare", "labels": {KUBESHARE_GPU_REQUEST: "0.2", KUBESHARE_GPU_LIMIT: "0.5"}},
                "spec": {"containers": [{"name": "c", "image": "cuda",
                                         "resources": {"limits": {RESOURCE_GPU_MEM: "6"}}}]}},
                _preload_content=False)
            for name in ("group-1", "group-2"):
                node.create(name, {"c": 2}, annotations={ANN_AFFINITY: "pair"})
            for name in ("burst", "steady", "kubeshare", "group-1", "group-2"):
                node.running(name)
    # The ceiling, not the guaranteed share, is what the isolation layer enforces (the share is the extender's).
    assert (node.env("burst")[variable], node.env("steady")[variable], node.env("kubeshare")[variable]) == (
        "80", "20", "50")
    assert node.env("group-1")["NVIDIA_VISIBLE_DEVICES"] == node.env("group-2")["NVIDIA_VISIBLE_DEVICES"]


@with_driver
def test_on_a_gpu_node_a_pod_gets_the_real_gpu_its_annotations_name() -> None:
    """The whole path on the driver's GPUs: NVML discovery, the published inventory, the extender's choice and
    Allocate's environment, for pods of a quarter and of half a GPU's advertised units (both fit one GPU)."""
    driver = driver_gpus()
    assert driver is not None
    uuids = [uuid for uuid, _ in driver]
    with rig(backend=NvmlBackend()) as node:
        inventory = eventually(lambda: decode_inventory(
            node.node()["metadata"]["annotations"].get(ANN_NODE_INVENTORY, "[]")), "the inventory annotation")
        assert [entry.uuid for entry in inventory] == uuids
        devices = node.kubelet.devices(RESOURCE_GPU_MEM)  # one per GiB of each GPU
        assert {uuid_of(device) for device in devices} == set(uuids)
        assert set(devices.values()) == {"Healthy"}
        advertised = eventually(lambda: int(node.node()["status"]["allocatable"].get(RESOURCE_GPU_MEM, "0")),
                                "the kubelet's gpu-mem")
        assert advertised == len(devices)
        per_gpu = advertised // len(uuids)
        with running_extender(node.cluster) as url, SchedulerLoop(node.cluster.api_client(),
                                                                  url + "/gpushare-scheduler") as loop:
            loop.start()
            node.create("quarter", {"c": max(per_gpu // 4, 1)})
            node.create("half", {"c": max(per_gpu // 2, 1)})
            for name in ("quarter", "half"):
                annotations = node.running(name)["metadata"]["annotations"]
                gpus = [uuids[int(i)] for i in annotations[ANN_GPU_INDICES].split(",")]
                assert node.env(name)["NVIDIA_VISIBLE_DEVICES"] == ",".join(gpus)
                assert node.env(name)["ALIYUN_COM_GPU_MEM_POD"] == annotations[ANN_POD]
