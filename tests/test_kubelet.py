"""The device plugin and the simulated kubelet together, over real unix sockets, against the local API server.

Pods are placed the way the extender places them: created, annotated with ``new_assignment`` and
bound with a Binding. The kubelet then admits them through the plugin exactly as a real one would.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from alert_rules import alert_rules, unexported_reads
from conftest import short_tmpdir, without_driver
from kubernetes import client

from deviceplugin.allocator import Allocator
from deviceplugin.gpus import GPUBackend, ProcessUsage
from deviceplugin.inventory import Inventory
from deviceplugin.isolation import Isolation, IsolationConfig
from deviceplugin.nvml import NvmlBackend
from deviceplugin.plugin import SOCKET_NAME, DevicePlugin, PluginConfig
from deviceplugin.podcache import PodCache
from deviceplugin.simulated import SimulatedBackend
from gpushare.clusterspec import ClusterSpec
from gpushare.contract import (
    ANN_ALLOCATED_CONTAINERS,
    ANN_ASSIGNED,
    ANN_COMPUTE,
    ANN_GPU_COUNT,
    ANN_GPU_UUIDS,
    ANN_IDX,
    ANN_MEMORY_UNIT,
    ANN_NODE_INVENTORY,
    RESOURCE_GPU_COUNT,
    RESOURCE_GPU_MEM,
    MemoryUnit,
    decode_inventory,
    new_assignment,
    parse_request,
)
from gpushare.kube.api import DEFAULT_TIMEOUT_S, MERGE_PATCH, Conflict, Kube, Obj, Pods
from gpushare.kube.convert import pod_info
from gpushare.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from gpushare.kubeletapi import deviceplugin_v1beta1_pb2_grpc as rpc
from gpushare.localcluster import LocalCluster
from gpushare.localcluster.kubelet import SimulatedKubelet

NODE = "gpu-node"
SPEC = ClusterSpec.model_validate({"nodes": [{"name": NODE, "gpus": [
    {"model": "Tesla-V100-SXM2-16GB", "memoryMiB": 16160, "numa": 0, "nvlink": [1]},
    {"model": "Tesla-V100-SXM2-16GB", "memoryMiB": 16160, "numa": 0},
    {"model": "A100-SXM4-40GB", "memoryMiB": 40960, "numa": 1}]}]})
UUIDS = [SPEC.node(NODE).gpu_uuid(i) for i in range(3)]
GIB = [16, 16, 40]


def eventually(condition: Callable[[], Any], what: str, timeout_s: float = 15) -> Any:
    """Wait for ``condition()`` to be truthy and return it; fail naming ``what`` if it never is."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@dataclass
class Rig:
    cluster: LocalCluster
    core: Any
    kubelet: SimulatedKubelet
    plugin: DevicePlugin
    directory: Path

    def pod(self, name: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.core.read_namespaced_pod(name, "default", _preload_content=False).data)
        return data

    def node(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.core.read_node(NODE, _preload_content=False).data)
        return data

    def create(self, name: str, containers: dict[str, int], gpu_count: int = 0,
               annotations: dict[str, str] | None = None) -> None:
        specs = [{"name": container, "image": "cuda", "resources": {"limits": {RESOURCE_GPU_MEM: str(units)}}}
                 for container, units in containers.items()]
        annotations = dict(annotations or {})
        if gpu_count:
            annotations[ANN_GPU_COUNT] = str(gpu_count)
        body = {"metadata": {"name": name, "namespace": "default", "annotations": annotations},
                "spec": {"containers": specs}}
        self.core.create_namespaced_pod("default", body, _preload_content=False)

    def place(self, name: str, gpus: tuple[int, ...], assume_ns: int | None = None,
              unit: MemoryUnit = MemoryUnit.GiB) -> None:
        """What the extender's bind does: write the assignment, then bind the pod to the node."""
        request = parse_request(pod_info(self.pod(name)))
        assignment = new_assignment(request, gpus, GIB[gpus[0]], unit, assume_ns or time.time_ns())
        annotations = assignment.annotations()
        self.core.patch_namespaced_pod(name, "default", {"metadata": {"annotations": annotations}},
                                       _content_type=MERGE_PATCH, _preload_content=False)
        self.bind(name)

    def bind(self, name: str) -> None:
        body = client.V1Binding(metadata=client.V1ObjectMeta(name=name),
                                target=client.V1ObjectReference(kind="Node", name=NODE))
        self.core.create_namespaced_binding("default", body, _preload_content=False)

    def running(self, name: str) -> dict[str, Any]:
        # The kubelet retries a failed admission with backoff; on a loaded machine that takes more than 15 s.
        pod: dict[str, Any] = eventually(lambda: (p := self.pod(name))["status"].get("phase") == "Running" and p,
                                         f"{name} Running", timeout_s=45)
        return pod

    def env(self, name: str, container: str = "c") -> dict[str, str]:
        return self.kubelet.allocations[f"default/{name}"][container]


@contextmanager
def rig(backend: GPUBackend | None = None, isolation: IsolationConfig | None = None,
        recovery_s: float = 600, usage_s: float = 15) -> Iterator[Rig]:
    with short_tmpdir() as directory, LocalCluster(SPEC, publish_inventory=False) as cluster:
        kubelet = SimulatedKubelet(cluster.api_client(), NODE, directory).start()
        config = PluginConfig(NODE, plugin_dir=directory, pod_resources_socket=kubelet.pod_resources_socket,
                              isolation=isolation or IsolationConfig(), health_recovery_s=recovery_s,
                              reconcile_s=0.1, usage_s=usage_s, metrics_address="127.0.0.1", metrics_port=0)
        plugin = DevicePlugin(config, backend or SimulatedBackend(SPEC.node(NODE), directory / "control.jsonl"),
                              Kube.from_api_client(cluster.api_client()))
        plugin.start()
        try:
            eventually(lambda: kubelet.registered(RESOURCE_GPU_MEM) and plugin.ready(), "registration")
            yield Rig(cluster, client.CoreV1Api(cluster.api_client()), kubelet, plugin, directory)
        finally:
            plugin.stop()
            kubelet.stop()


@pytest.fixture
def node() -> Iterator[Rig]:
    with rig() as r:
        # Registered is not yet usable: until ListAndWatch's first list arrives the kubelet has no devices of the
        # resource and refuses a pod for lack of them, as a real kubelet would.
        eventually(lambda: r.kubelet.devices(RESOURCE_GPU_MEM), "the first device list")
        yield r


def test_the_plugin_registers_and_advertises_each_gpu_with_its_own_memory(node: Rig) -> None:
    devices = eventually(lambda: node.kubelet.devices(RESOURCE_GPU_MEM), "the device list")
    per_gpu = {uuid: sum(1 for d in devices if d.startswith(uuid + "-_-")) for uuid in UUIDS}
    assert per_gpu == dict(zip(UUIDS, GIB, strict=True)) and len(devices) == 72
    status = eventually(lambda: (n := node.node())["status"]["capacity"].get(RESOURCE_GPU_COUNT) and n, "gpu-count")
    eventually(lambda: node.node()["status"]["allocatable"].get(RESOURCE_GPU_MEM) == "72", "gpu-mem allocatable")
    assert status["status"]["allocatable"][RESOURCE_GPU_COUNT] == "3"
    annotations = node.node()["metadata"]["annotations"]
    inventory = decode_inventory(annotations[ANN_NODE_INVENTORY])
    assert annotations[ANN_MEMORY_UNIT] == "GiB"
    assert [(g.model, g.memory_mib, g.uuid, g.numa, g.healthy) for g in inventory] == [
        (s.model, s.memory_mib, UUIDS[i], s.numa, True) for i, s in enumerate(SPEC.node(NODE).gpus)]
    assert inventory[0].links == {1: 100}
    with grpc.insecure_channel(f"unix://{node.directory / SOCKET_NAME}") as channel:
        stub = rpc.DevicePluginStub(channel)
        assert stub.GetDevicePluginOptions(pb.Empty(), timeout=5).get_preferred_allocation_available
        first = next(iter(stub.ListAndWatch(pb.Empty(), timeout=5)))
    numa = {d.ID.rpartition("-_-")[0]: [n.ID for n in d.topology.nodes] for d in first.devices}
    assert numa == {UUIDS[0]: [0], UUIDS[1]: [0], UUIDS[2]: [1]}


def test_a_bound_pod_gets_the_extenders_gpu_and_is_marked_assigned(node: Rig) -> None:
    node.create("web", {"c": 4})
    node.place("web", (2,))
    pod = node.running("web")
    assert node.env("web") == {"NVIDIA_VISIBLE_DEVICES": UUIDS[2], "ALIYUN_COM_GPU_MEM_IDX": "2",
                               "ALIYUN_COM_GPU_MEM_POD": "4", "ALIYUN_COM_GPU_MEM_CONTAINER": "4",
                               "ALIYUN_COM_GPU_MEM_DEV": "40"}
    annotations = pod["metadata"]["annotations"]
    assert annotations[ANN_ASSIGNED] == "true" and annotations[ANN_GPU_UUIDS] == UUIDS[2]


def test_a_pod_with_two_gpu_containers_gets_one_gpu_for_both(node: Rig) -> None:
    node.create("pair", {"train": 4, "side": 2})
    node.place("pair", (1,))
    annotations = node.running("pair")["metadata"]["annotations"]
    train, side = node.env("pair", "train"), node.env("pair", "side")
    assert train["NVIDIA_VISIBLE_DEVICES"] == side["NVIDIA_VISIBLE_DEVICES"] == UUIDS[1]
    assert (train["ALIYUN_COM_GPU_MEM_CONTAINER"], side["ALIYUN_COM_GPU_MEM_CONTAINER"]) == ("4", "2")
    assert train["ALIYUN_COM_GPU_MEM_POD"] == "6"
    assert annotations[ANN_ASSIGNED] == "true" and annotations[ANN_ALLOCATED_CONTAINERS] == "train,side"


def test_a_multi_gpu_pod_sees_all_its_gpus_each_capped_at_its_share() -> None:
    with rig(isolation=IsolationConfig(Isolation.HAMI_CORE)) as node:
        node.create("wide", {"c": 8}, gpu_count=2)
        node.place("wide", (0, 1))
        node.running("wide")
        env = node.env("wide")
        assert env["NVIDIA_VISIBLE_DEVICES"] == f"{UUIDS[0]},{UUIDS[1]}"
        assert env["ALIYUN_COM_GPU_MEM_IDX"] == "0,1"
        assert (env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_MEMORY_LIMIT_1"]) == ("4096m", "4096m")


def test_same_size_pods_admitted_in_reverse_order_end_up_with_true_annotations(node: Rig) -> None:
    with node.kubelet.paused():
        node.create("p1-assumed-late", {"c": 4})
        node.create("p2-assumed-early", {"c": 4})
        node.place("p2-assumed-early", (0,), assume_ns=1_000)
        node.place("p1-assumed-late", (1,), assume_ns=2_000)
        eventually(lambda: sum(ANN_IDX in p.annotations and p.node_name == NODE for p in node.plugin.cache.pods()) == 2,
                   "the plugin seeing both pods placed")
    # The kubelet admits p1 first (created first), while p2 (assumed first) is also waiting: Allocate cannot
    # tell them apart, so p1's container gets p2's GPU. The reconciler must notice and fix both annotations.
    for name in ("p1-assumed-late", "p2-assumed-early"):
        node.running(name)

    def truthful() -> bool:
        for name in ("p1-assumed-late", "p2-assumed-early"):
            annotations = node.pod(name)["metadata"]["annotations"]
            if UUIDS[int(annotations[ANN_IDX])] != node.env(name)["NVIDIA_VISIBLE_DEVICES"]:
                return False
            if annotations[ANN_GPU_UUIDS] != node.env(name)["NVIDIA_VISIBLE_DEVICES"]:
                return False
        return True

    eventually(truthful, "annotations matching the GPUs the containers got")
    indices = [node.pod(name)["metadata"]["annotations"][ANN_IDX] for name in ("p1-assumed-late", "p2-assumed-early")]
    assert sorted(indices) == ["0", "1"]
    # Usually the reconciler corrects both pods: p1 got p2's GPU 0. On a loaded machine the kubelet's Allocate can
    # instead arrive after the watch shows both pods, and Allocate itself records the GPUs the devices name (either
    # pod may then hold either GPU). Either way the annotations above end up true; the reconciler corrects both or
    # neither.
    corrections = node.plugin.registry.get_sample_value("gpushare_deviceplugin_reconcile_corrections_total")
    assert corrections in (0, 2)
    if corrections == 2:
        assert indices[0] == "0"


def test_after_a_kubelet_restart_the_plugin_registers_again_and_keeps_serving(node: Rig) -> None:
    before = node.kubelet.registrations
    node.kubelet.restart()
    assert not node.kubelet.registered(RESOURCE_GPU_MEM)
    eventually(lambda: node.kubelet.registered(RESOURCE_GPU_MEM) and node.kubelet.registrations > before,
               "registration after the restart")
    eventually(lambda: len(node.kubelet.devices(RESOURCE_GPU_MEM)) == 72, "the device list after the restart")
    node.create("after", {"c": 2})
    node.place("after", (0,))
    node.running("after")
    assert node.env("after")["NVIDIA_VISIBLE_DEVICES"] == UUIDS[0]


def test_an_xid_makes_a_gpu_unhealthy_and_it_recovers_after_a_quiet_period() -> None:
    with rig(recovery_s=1.0) as node:
        with (node.directory / "control.jsonl").open("a") as control:
            control.write(json.dumps({"gpu": 0, "xid": 43}) + "\n")  # an application fault: ignored
            control.write(json.dumps({"gpu": 0, "xid": 79}) + "\n")

        def gpu0_health() -> set[str]:
            return {h for d, h in node.kubelet.devices(RESOURCE_GPU_MEM).items() if d.startswith(UUIDS[0])}

        eventually(lambda: gpu0_health() == {"Unhealthy"}, "GPU 0's devices Unhealthy")
        assert {h for d, h in node.kubelet.devices(RESOURCE_GPU_MEM).items() if d.startswith(UUIDS[2])} == {"Healthy"}
        eventually(lambda: node.node()["status"]["allocatable"][RESOURCE_GPU_MEM] == "56", "allocatable 56")
        eventually(lambda: not decode_inventory(node.node()["metadata"]["annotations"][ANN_NODE_INVENTORY])[0].healthy,
                   "the inventory annotation showing GPU 0 unhealthy")
        eventually(lambda: gpu0_health() == {"Healthy"}, "GPU 0 recovering")
        eventually(lambda: node.node()["status"]["allocatable"][RESOURCE_GPU_MEM] == "72", "allocatable 72 again")
        eventually(lambda: decode_inventory(node.node()["metadata"]["annotations"][ANN_NODE_INVENTORY])[0].healthy,
                   "the inventory annotation showing GPU 0 healthy")


def test_a_pod_that_skipped_the_extender_fails_with_a_clear_reason(node: Rig) -> None:
    node.create("rogue", {"c": 3})
    node.bind("rogue")
    status = eventually(lambda: (p := node.pod("rogue"))["status"].get("phase") == "Failed" and p["status"],
                        "the pod failing admission")
    assert status["reason"] == "UnexpectedAdmissionError"
    assert "not placed by the gpushare scheduler extender" in status["message"]
    assert "default/rogue" in status["message"] and "schedulerName" in status["message"]
    assert "default/rogue" not in node.kubelet.allocations


@without_driver
def test_without_a_driver_the_plugin_serves_an_empty_list(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="deviceplugin")
    with rig(backend=NvmlBackend()) as node:
        eventually(lambda: node.node()["status"]["capacity"].get(RESOURCE_GPU_COUNT) == "0", "gpu-count 0")
        eventually(lambda: node.node()["status"]["capacity"].get(RESOURCE_GPU_MEM) == "0", "gpu-mem 0")
        assert node.kubelet.devices(RESOURCE_GPU_MEM) == {}
    driver = [r.getMessage() for r in caplog.records if "driver" in r.getMessage()]
    assert driver == ["The NVIDIA driver is not installed on this node (NVML library not found), so it advertises "
                      "no GPUs; install the driver and restart the device plugin."]


@pytest.mark.parametrize("mode", [Isolation.HAMI_CORE, Isolation.MPS])
def test_isolation_settings_reach_the_container(mode: Isolation) -> None:
    isolation = IsolationConfig(mode, hami_library="/host/libvgpu.so", hami_preload="/host/preload",
                                mps_pipe_dir="/host/mps")
    with rig(isolation=isolation) as node:
        node.create("capped", {"c": 5}, annotations={ANN_COMPUTE: "25"})
        node.place("capped", (2,))
        node.running("capped")
        env, mounts = node.env("capped"), node.kubelet.mounts["default/capped"]["c"]
        if mode is Isolation.HAMI_CORE:
            assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "5120m" and env["CUDA_DEVICE_SM_LIMIT"] == "25"
            assert mounts == [("/usr/local/vgpu/libvgpu.so", "/host/libvgpu.so", True),
                              ("/etc/ld.so.preload", "/host/preload", True)]
        else:
            assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=5120M"
            assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
            assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/host/mps" and mounts == [("/host/mps", "/host/mps", False),
                                                                           ("/dev/shm", "/dev/shm", False)]


def test_status_endpoints_and_per_gpu_metrics(node: Rig) -> None:
    node.create("metered", {"c": 3})
    node.place("metered", (1,))
    node.running("metered")
    base = f"http://127.0.0.1:{node.plugin.status.port}"
    assert httpx.get(f"{base}/healthz").status_code == 200
    assert httpx.get(f"{base}/readyz").status_code == 200
    assert httpx.get(f"{base}/nothing").status_code == 404
    text = eventually(lambda: (t := httpx.get(f"{base}/metrics").text) and "usedMiB" not in t and t, "metrics")
    labels = f'gpu="1",model="Tesla-V100-SXM2-16GB",uuid="{UUIDS[1]}"'
    assert f"gpushare_gpu_memory_allocated_mib{{{labels}}} 3072.0" in text
    assert f"gpushare_gpu_memory_total_mib{{{labels}}} 16160.0" in text
    assert f"gpushare_gpu_healthy{{{labels}}} 1.0" in text
    assert 'gpushare_deviceplugin_allocations_total{outcome="allocated"} 1.0' in text


def test_every_series_and_label_the_device_plugin_alerts_read_is_on_its_metrics(node: Rig, chart_out: Path) -> None:
    text = httpx.get(f"http://127.0.0.1:{node.plugin.status.port}/metrics").text
    assert unexported_reads(alert_rules(chart_out, "gpushare-device-plugin"), text) == []


def test_memory_use_above_a_pods_share_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="deviceplugin")
    backend = SimulatedBackend(SPEC.node(NODE))
    with rig(backend=backend, usage_s=0.05) as node:
        node.create("greedy", {"c": 2})
        node.place("greedy", (0,))
        uid = node.running("greedy")["metadata"]["uid"]
        backend.set_process_usage(ProcessUsage(0, 3000, uid))
        message = eventually(lambda: next((r.getMessage() for r in caplog.records
                                           if "more than its share" in r.getMessage()), None), "the over-share log")
    assert message.startswith("Pod default/greedy uses 3000 MiB on GPU 0, more than its share of 2048 MiB")


def test_mib_units_advertise_one_device_per_mib() -> None:
    small = ClusterSpec.model_validate({"nodes": [{"name": NODE, "gpus": [{"model": "T4", "memoryMiB": 1500}]}]})
    with short_tmpdir() as directory, LocalCluster(small, publish_inventory=False) as cluster:
        kubelet = SimulatedKubelet(cluster.api_client(), NODE, directory).start()
        plugin = DevicePlugin(PluginConfig(NODE, unit=MemoryUnit.MiB, plugin_dir=directory,
                                           pod_resources_socket=kubelet.pod_resources_socket,
                                           metrics_address="127.0.0.1", metrics_port=0),
                              SimulatedBackend(small.node(NODE)),
                              Kube.from_api_client(cluster.api_client()))
        plugin.start()
        try:
            eventually(lambda: len(kubelet.devices(RESOURCE_GPU_MEM)) == 1500, "1500 MiB devices")
        finally:
            plugin.stop()
            kubelet.stop()


def test_allocate_refuses_devices_that_are_not_the_plugins(node: Rig) -> None:
    with grpc.insecure_channel(f"unix://{node.directory / SOCKET_NAME}") as channel:
        stub = rpc.DevicePluginStub(channel)
        for devices, reason in ((["GPU-nope-_-0"], "which this node does not have"),
                                (["nvidia0"], "is not a gpushare device ID")):
            with pytest.raises(grpc.RpcError) as caught:
                stub.Allocate(pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(
                    devices_ids=devices)]), timeout=5)
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert reason in str(caught.value.details())


def test_allocate_refuses_a_pod_placed_in_another_unit(node: Rig) -> None:
    node.create("placed-in-mib", {"c": 2})
    # The test plays the kubelet's Allocate itself, once the plugin's watch shows the pod placed (a loaded machine
    # may deliver it well after the Binding); the simulated kubelet, paused, does not race it.
    with node.kubelet.paused():
        node.place("placed-in-mib", (0,), unit=MemoryUnit.MiB)  # an extender that believed this node counts MiB
        eventually(lambda: any(p.name == "placed-in-mib" and p.node_name == NODE for p in node.plugin.cache.pods()),
                   "the plugin seeing the pod placed")
        with grpc.insecure_channel(f"unix://{node.directory / SOCKET_NAME}") as channel, \
                pytest.raises(grpc.RpcError) as caught:
            rpc.DevicePluginStub(channel).Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=[f"{UUIDS[0]}-_-0", f"{UUIDS[0]}-_-1"])]), timeout=5)
    assert ("Pod default/placed-in-mib was placed by the gpushare extender in MiB of GPU memory, but node "
            f"{NODE}'s device plugin advertises GiB; gpushare refuses to convert") in str(caught.value.details())
    assert node.pod("placed-in-mib")["metadata"]["annotations"][ANN_ASSIGNED] == "false"


def test_the_kubelet_refuses_a_plugin_of_another_api_version(node: Rig) -> None:
    with grpc.insecure_channel(f"unix://{node.kubelet.socket_path}") as channel, \
            pytest.raises(grpc.RpcError) as caught:
        rpc.RegistrationStub(channel).Register(pb.RegisterRequest(
            version="v1alpha", endpoint=SOCKET_NAME, resource_name="example.com/thing"), timeout=5)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "speaks device plugin API v1beta1" in str(caught.value.details())


class RacingPods(Pods):
    """Changes the pod through the API just before the plugin's first write, as another controller might."""

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__(cluster.api_client())
        self._other = client.CoreV1Api(cluster.api_client())
        self.conflicts = 0

    def annotate(self, namespace: str, name: str, resource_version: str | None,
                 annotations: Mapping[str, str | None], *, timeout_s: float = DEFAULT_TIMEOUT_S) -> Obj:
        if not self.conflicts:
            self._other.patch_namespaced_pod(name, namespace, {"metadata": {"labels": {"touched": "yes"}}},
                                             _content_type=MERGE_PATCH, _preload_content=False)
            try:
                return super().annotate(namespace, name, resource_version, annotations, timeout_s=timeout_s)
            except Conflict:
                self.conflicts += 1
                raise
        return super().annotate(namespace, name, resource_version, annotations, timeout_s=timeout_s)


def test_a_conflicting_write_is_retried_on_the_fresh_pod() -> None:
    with LocalCluster(SPEC, publish_inventory=False) as cluster:
        core = client.CoreV1Api(cluster.api_client())
        placer = Rig(cluster, core, None, None, Path("/nonexistent"))  # type: ignore[arg-type]
        placer.create("raced", {"c": 2})
        placer.place("raced", (1,))
        cache = PodCache(Pods(cluster.api_client()), NODE)
        cache.start()
        try:
            assert cache.wait_synced(10)
            eventually(lambda: (p := cache.get("default/raced")) is not None and p.node_name == NODE,
                       "the cache seeing the bound pod")
            writer = RacingPods(cluster)
            inventory = Inventory(SimulatedBackend(SPEC.node(NODE)).discover(), MemoryUnit.GiB, recovery_s=600)
            [(env, _)] = Allocator(cache, writer, inventory, IsolationConfig()).allocate([[f"{UUIDS[1]}-_-0",
                                                                                           f"{UUIDS[1]}-_-1"]])
        finally:
            cache.stop()
        pod = placer.pod("raced")
    assert writer.conflicts == 1 and env["NVIDIA_VISIBLE_DEVICES"] == UUIDS[1]
    assert pod["metadata"]["annotations"][ANN_ASSIGNED] == "true" and pod["metadata"]["labels"]["touched"] == "yes"
