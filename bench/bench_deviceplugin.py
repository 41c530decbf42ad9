"""Device plugin figures: Allocate latency on a busy node, and the size of the ListAndWatch device list.

Allocate: one node with ``--gpus`` GPUs and ``--pods`` pods bound to it (placed as the extender does), the
plugin serving on a real unix socket against the local API server, and a client calling Allocate for each
pod's container the way the kubelet does. Two baselines measured in the same process put it in proportion:
an empty gRPC call over the same socket, and the one annotation PATCH that Allocate must make.

ListAndWatch: the serialized size of the device list for the same GPUs in GiB and in MiB units, and whether
a client with gRPC's default 4 MiB receive limit (the kubelet's) can take it.

Usage: ``.venv/bin/python bench/bench_deviceplugin.py [--pods 200] [--gpus 8] [--gpu-mib 81920]``
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from kubernetes import client
from tabulate import tabulate

from deviceplugin.devices import device_ids
from deviceplugin.inventory import Inventory
from deviceplugin.plugin import SOCKET_NAME, DevicePlugin, PluginConfig
from deviceplugin.service import device_list
from deviceplugin.simulated import SimulatedBackend
from gpushare.clusterspec import ClusterSpec
from gpushare.contract import RESOURCE_GPU_MEM, MemoryUnit, new_assignment, parse_request
from gpushare.kube.api import MERGE_PATCH, Kube
from gpushare.kube.convert import pod_info
from gpushare.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from gpushare.kubeletapi import deviceplugin_v1beta1_pb2_grpc as rpc
from gpushare.localcluster import LocalCluster

NODE = "bench-node"


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def timed(call: Callable[[], object], repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def place_pods(core: Any, pods: int, gpus: int, gpu_gib: int, units: int) -> list[tuple[str, int]]:
    """Create, annotate and bind ``pods`` pods round-robin over the GPUs; return (name, gpu) pairs."""
    placed = []
    for i in range(pods):
        name = f"pod-{i:04d}"
        core.create_namespaced_pod("default", {"metadata": {"name": name}, "spec": {"containers": [
            {"name": "c", "image": "cuda", "resources": {"limits": {RESOURCE_GPU_MEM: str(units)}}}]}},
            _preload_content=False)
        obj = json.loads(core.read_namespaced_pod(name, "default", _preload_content=False).data)
        gpu = i % gpus
        assignment = new_assignment(parse_request(pod_info(obj)), [gpu], gpu_gib, MemoryUnit.GiB, time.time_ns())
        annotations = assignment.annotations()
        core.patch_namespaced_pod(name, "default", {"metadata": {"annotations": annotations}},
                                  _content_type=MERGE_PATCH, _preload_content=False)
        core.create_namespaced_binding("default", client.V1Binding(
            metadata=client.V1ObjectMeta(name=name), target=client.V1ObjectReference(kind="Node", name=NODE)),
            _preload_content=False)
        placed.append((name, gpu))
    return placed


def bench_allocate(args: argparse.Namespace) -> list[list[object]]:
    spec = ClusterSpec.model_validate({"nodes": [{"name": NODE, "pods": str(args.pods + 10), "gpus": [
        {"model": "A100-SXM4-80GB", "memoryMiB": args.gpu_mib, "numa": i // 4} for i in range(args.gpus)]}]})
    gpu_gib = MemoryUnit.GiB.from_mib(args.gpu_mib)
    # unix socket paths must stay short, so the plugin's folder lives directly under /tmp
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="gs-bench-") as folder, \
            LocalCluster(spec, publish_inventory=False) as cluster:
        directory = Path(folder)
        core: Any = client.CoreV1Api(cluster.api_client())
        placed = place_pods(core, args.pods, args.gpus, gpu_gib, args.units)
        plugin = DevicePlugin(PluginConfig(NODE, plugin_dir=directory, pod_resources_socket=directory / "none.sock",
                                           reconcile_s=3600, usage_s=3600, metrics_address="127.0.0.1",
                                           metrics_port=0),
                              SimulatedBackend(spec.node(NODE)), Kube.from_api_client(cluster.api_client()))
        plugin.start()
        try:
            if not plugin.cache.wait_synced(30):
                raise SystemExit("The plugin's pod cache did not sync with the local API server.")
            free = {g.index: device_ids(g, MemoryUnit.GiB) for g in plugin.inventory.gpus}
            with grpc.insecure_channel(f"unix://{directory / SOCKET_NAME}") as channel:
                stub = rpc.DevicePluginStub(channel)
                empty = timed(lambda: stub.GetDevicePluginOptions(pb.Empty(), timeout=10), args.pods)
                allocate = []
                for _name, gpu in placed:
                    ids, free[gpu] = free[gpu][:args.units], free[gpu][args.units:]
                    request = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
                    allocate += timed(lambda r=request: stub.Allocate(r, timeout=10), 1)  # type: ignore[misc]
            patch = timed(lambda: core.patch_namespaced_pod(
                "pod-0000", "default", {"metadata": {"annotations": {"bench": str(time.time_ns())}}},
                _content_type=MERGE_PATCH, _preload_content=False).data, args.pods)
            assigned = sum(1 for p in plugin.cache.pods() if p.annotations.get("ALIYUN_COM_GPU_MEM_ASSIGNED") == "true")
        finally:
            plugin.stop()
    if assigned != args.pods:
        raise SystemExit(f"Only {assigned} of {args.pods} pods were marked assigned; the benchmark is invalid.")
    rows: list[list[object]] = [
        [what, f"{statistics.median(s):.2f}", f"{percentile(s, 0.99):.2f}", len(s)] for what, s in (
            (f"Allocate ({args.pods} pods bound, {args.gpus} GPUs)", allocate),
            ("baseline: empty gRPC call, same socket", empty),
            ("baseline: one pod annotation PATCH", patch))]
    own = statistics.median(allocate) - statistics.median(patch) - statistics.median(empty)
    rows.append(["Allocate's own work (median less both baselines)", f"{own:.2f}", "", ""])
    return rows


def bench_list_size(args: argparse.Namespace) -> list[list[object]]:
    spec = ClusterSpec.model_validate({"nodes": [{"name": NODE, "gpus": [
        {"model": "A100-SXM4-80GB", "memoryMiB": args.gpu_mib, "numa": i // 4} for i in range(args.gpus)]}]})
    gpus = SimulatedBackend(spec.node(NODE)).discover()
    rows: list[list[object]] = []
    for unit in (MemoryUnit.GiB, MemoryUnit.MiB):
        inventory = Inventory(gpus, unit, recovery_s=600)
        started = time.perf_counter()
        size = device_list(inventory).ByteSize()
        build_ms = (time.perf_counter() - started) * 1000
        devices = sum(unit.from_mib(g.memory_mib) for g in gpus)
        fits = "yes" if size <= 4 * 1024 * 1024 else "no (RESOURCE_EXHAUSTED)"
        rows.append([unit.value, devices, f"{size:,}", f"{size / 2**20:.2f}", f"{build_ms:.0f}", fits])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--gpu-mib", type=int, default=81920, help="memory of each GPU (default 80 GiB)")
    parser.add_argument("--units", type=int, default=3, help="GiB each pod asks for (default 3)")
    args = parser.parse_args()
    if args.pods * args.units > args.gpus * MemoryUnit.GiB.from_mib(args.gpu_mib):
        raise SystemExit("The pods do not fit on the GPUs; lower --pods or --units.")
    logging.basicConfig(level=logging.WARNING)
    print(tabulate(bench_allocate(args), headers=["call", "median ms", "p99 ms", "samples"]))
    print()
    print(tabulate(bench_list_size(args), headers=[
        "unit", "devices", "ListAndWatch bytes", "MiB", "build ms", "fits gRPC's 4 MiB default"]))


if __name__ == "__main__":
    main()
