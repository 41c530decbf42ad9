"""The scheduler loop ranks the nodes a pod fits as kube-scheduler's default score plugins do.

Without an extender (the floor the extender's throughput is measured against), and for pods the extender is not
asked about, kube-scheduler scores every feasible node with NodeResourcesFit (least allocated) and
NodeResourcesBalancedAllocation. The figures in the comments are those plugins' formulas worked by hand.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
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


# Nodes of different shapes, so that the two scores pull different ways: CPU-rich, memory-rich, small, balanced.
VARIED = [("4", 8), ("8", 8), ("16", 64), ("32", 16), ("2", 32)]
MIB = 1 << 20
# kube-scheduler's scoring counts an unset request as these (schedutil.DefaultMilliCPURequest, DefaultMemoryRequest).
UNSET_MILLI, UNSET_BYTES = 100, 200 * MIB

Request = tuple[int | None, int | None]  # CPU in millicores and memory in MiB, None where the container sets none


@pytest.fixture(scope="module")
def varied() -> Iterator[LocalCluster]:
    nodes = [NodeSpec(name=f"n{i}", cpu=cpu, memory=f"{gib}Gi") for i, (cpu, gib) in enumerate(VARIED)]
    with LocalCluster(spec(*nodes)) as cluster:
        yield cluster


def _manifest(name: str, request: Request) -> dict[str, Any]:
    cpu, memory = request
    return _pod(name, {**({"cpu": f"{cpu}m"} if cpu is not None else {}),
                       **({"memory": f"{memory}Mi"} if memory is not None else {})})


def _kube_scheduler_score(cpu_total: int, memory_total: int, pods: list[Request], pod: Request) -> int:
    """NodeResourcesFit (least allocated) plus NodeResourcesBalancedAllocation, in kube-scheduler's integer
    arithmetic with memory in bytes, written from its formulas independently of the loop's code."""
    def nonzero(r: Request) -> tuple[int, int]:
        return (UNSET_MILLI if r[0] is None else r[0], UNSET_BYTES if r[1] is None else r[1] * MIB)

    def actual(r: Request) -> tuple[int, int]:
        return (r[0] or 0, (r[1] or 0) * MIB)

    def least(requested: int, capacity: int) -> int:
        return 0 if requested > capacity else (capacity - requested) * 100 // capacity

    cpu_scored = sum(nonzero(p)[0] for p in [*pods, pod])
    memory_scored = sum(nonzero(p)[1] for p in [*pods, pod])
    score = (least(cpu_scored, cpu_total) + least(memory_scored, memory_total)) // 2
    if actual(pod) != (0, 0):
        cpu_share = min(sum(actual(p)[0] for p in [*pods, pod]) / cpu_total, 1.0)
        memory_share = min(sum(actual(p)[1] for p in [*pods, pod]) / memory_total, 1.0)
        score += int((1 - abs(cpu_share - memory_share) / 2) * 100)
    return score


requests_strategy = st.tuples(st.sampled_from([None, 0, 100, 500, 1000, 3000, 6000]),
                              st.sampled_from([None, 0, 128, 1024, 4096, 12288]))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pods=st.lists(requests_strategy, min_size=1, max_size=6))
def test_the_floor_picks_a_node_kube_scheduler_scores_highest(varied: LocalCluster, pods: list[Request]) -> None:
    core = emptied_core(varied)
    placed: dict[str, list[Request]] = {f"n{i}": [] for i in range(len(VARIED))}
    with SchedulerLoop(varied.api_client(), None, seed=3) as loop:
        for i, request in enumerate(pods):
            fits = {name: _kube_scheduler_score(int(VARIED[k][0]) * 1000, VARIED[k][1] << 30, placed[name], request)
                    for k, name in enumerate(placed)
                    if sum((p[0] or 0) for p in [*placed[name], request]) <= int(VARIED[k][0]) * 1000
                    and sum((p[1] or 0) for p in [*placed[name], request]) <= VARIED[k][1] << 10}
            create_pod(core, _manifest(f"p{i}", request))
            node = loop.schedule_pod(f"p{i}").node
            if not fits:
                assert node is None
                continue
            assert node is not None and fits[node] == max(fits.values()), (request, node, fits)
            placed[node].append(request)
