"""The scheduler loop ranks the nodes a pod fits as kube-scheduler's default score plugins do.

Without an extender (the floor the extender's throughput is measured against), and for pods the extender is not
asked about, kube-scheduler scores every feasible node with NodeResourcesFit (least allocated) and
NodeResourcesBalancedAllocation. The figures in the comments are those plugins' formulas worked by hand.
"""

from __future__ import annotations

from typing import Any

from test_extender_harness import create_pod, emptied_core, read_pod, spec

from gpushare.clusterspec import NodeSpec
from gpushare.localcluster import LocalCluster
from gpushare.localcluster.scheduler import SchedulerLoop


def _pod(name: str, requests: dict[str, str] | None = None) -> dict[str, Any]:
    resources = {"requests": requests} if requests else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "busybox", "resources": resources}]}}


def test_the_floor_takes_the_node_with_the_most_left_of_both_cpu_and_memory() -> None:
    cluster_spec = spec(NodeSpec(name="cpu-rich", cpu="32", memory="16Gi"),
                        NodeSpec(name="memory-rich", cpu="16", memory="128Gi"))
    with LocalCluster(cluster_spec) as cluster:
        core = emptied_core(cluster)
        create_pod(core, _pod("wide", {"cpu": "4", "memory": "12Gi"}))
        with SchedulerLoop(cluster.api_client(), None, seed=1) as loop:
            result = loop.schedule_pod("wide")
        # cpu-rich: least allocated (87 + 25) / 2 = 56, balanced 100 - 100 * |0.125 - 0.75| / 2 = 68, 124 in all;
        # memory-rich: (75 + 90) / 2 = 82 and 92, 174. By the share of CPU alone both were empty and alike.
        assert result.node == "memory-rich"
        assert read_pod(core, "wide")["spec"]["nodeName"] == "memory-rich"


def test_pods_that_request_nothing_still_spread() -> None:
    """kube-scheduler counts a container without requests as 100m of CPU and 200 MiB for scoring."""
    with LocalCluster(spec(NodeSpec(name="a", cpu="4", memory="8Gi"), NodeSpec(name="b", cpu="4", memory="8Gi"))
                      ) as cluster:
        core = emptied_core(cluster)
        names = [f"idle-{i}" for i in range(6)]
        for name in names:
            create_pod(core, _pod(name))
        with SchedulerLoop(cluster.api_client(), None, seed=1) as loop:
            placed = [loop.schedule_pod(name).node for name in names]
    # Each pod lowers its node's score, so the other node takes the next pod unless the scores (whole numbers) tie,
    # when either may: the nodes never grow two pods apart. With requests of 0 they would tie every time.
    assert sorted(placed) == ["a", "a", "a", "b", "b", "b"]
