"""End to end: scheduler loop -> real extender (HTTP) -> bind -> simulated kubelet -> device plugin (gRPC).

The node starts bare (no GPU resources); the plugin publishes its inventory and the kubelet its capacity, the
extender places pods from what they published, and every container ends up on the GPU its annotations name.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from test_extender_harness import running_extender
from test_kubelet import NODE, UUIDS, Rig, eventually, rig

from gpushare.contract import ANN_ASSIGNED, ANN_GPU_INDICES, ANN_NODE_INVENTORY, RESOURCE_GPU_MEM
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
