"""Node objects for the nodes of a cluster description, as a kubelet (and optionally the device plugin) would
register them."""

from __future__ import annotations

from gpushare.clusterspec import NodeSpec
from gpushare.contract import (
    ANN_NODE_INVENTORY,
    RESOURCE_GPU_COUNT,
    RESOURCE_GPU_MEM,
    GPUInventoryEntry,
    MemoryUnit,
    encode_inventory,
    unit_annotation,
)
from gpushare.localcluster.resources import Obj
from gpushare.localcluster.store import now_rfc3339

KUBELET_VERSION = "v1.37.0"
NVLINK_SCORE = 100


def fake_address(ordinal: int) -> str:
    """A distinct loopback address per node (data only: nothing listens there)."""
    return f"127.{1 + ordinal // 64516}.{ordinal // 254 % 254}.{1 + ordinal % 254}"


def inventory(spec: NodeSpec) -> list[GPUInventoryEntry]:
    """The node's GPUs as the device plugin publishes them; an NVLink listed on either GPU links both ways."""
    links: dict[int, dict[int, int]] = {i: {} for i in range(len(spec.gpus))}
    for i, gpu in enumerate(spec.gpus):
        for peer in gpu.nvlink:
            if peer != i and peer in links:
                links[i][peer] = NVLINK_SCORE
                links[peer][i] = NVLINK_SCORE
    return [GPUInventoryEntry(index=i, model=gpu.model, memory_mib=gpu.memory_mib, uuid=spec.gpu_uuid(i),
                              numa=gpu.numa, links=links[i]) for i, gpu in enumerate(spec.gpus)]


def node_object(spec: NodeSpec, ordinal: int, publish_inventory: bool) -> Obj:
    """A Ready node with the spec's capacity; with ``publish_inventory``, also what the device plugin adds."""
    capacity = {"cpu": spec.cpu, "memory": spec.memory, "pods": spec.pods}
    annotations = dict(spec.annotations)
    if publish_inventory and spec.gpus:
        capacity[RESOURCE_GPU_MEM] = str(sum(MemoryUnit.GiB.from_mib(g.memory_mib) for g in spec.gpus))
        capacity[RESOURCE_GPU_COUNT] = str(len(spec.gpus))
        annotations[ANN_NODE_INVENTORY] = encode_inventory(inventory(spec))
        annotations.update(unit_annotation(MemoryUnit.GiB))
    now = now_rfc3339()
    labels = {"kubernetes.io/hostname": spec.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              **spec.labels}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": spec.name, "labels": labels, "annotations": annotations},
        "spec": {},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status", "lastHeartbeatTime": now,
                            "lastTransitionTime": now}],
            "addresses": [{"type": "InternalIP", "address": fake_address(ordinal)},
                          {"type": "Hostname", "address": spec.name}],
            "nodeInfo": {"kubeletVersion": KUBELET_VERSION, "containerRuntimeVersion": "simulated://1.0",
                         "osImage": "gpushare local cluster", "kernelVersion": "simulated",
                         "operatingSystem": "linux", "architecture": "amd64", "machineID": "", "systemUUID": "",
                         "bootID": "", "kubeProxyVersion": ""},
        },
    }
