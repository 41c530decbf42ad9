"""Where the node is chosen: filter passes only the policy's favourite (the default), or every node that fits.

Driven by the local scheduler loop, which calls the extender as kube-scheduler does: prioritize only when more
than one node passed filter, its scores added to kube-scheduler's own. Both ways must bind every pod where the
policy prefers (prioritize at a weight that outweighs kube-scheduler's scores), and choosing in filter must
spare the prioritize call.
"""

from __future__ import annotations

import random

import httpx
import pytest
from test_extender_harness import (
    T4,
    T4_MIB,
    V100_32,
    V100_32_MIB,
    create_pod,
    emptied_core,
    gpu_node,
    pod_body,
    running_extender,
    spec,
)

from extender.config import ConfigError, ExtenderConfig, NodeChoice, parse_config
from gpushare.localcluster import LocalCluster
from gpushare.localcluster.scheduler import DECISIVE_EXTENDER_WEIGHT, SchedulerLoop
from gpushare.schedconfig import DEFAULT_WEIGHT

# Nodes of different sizes and models, so that the policy's scores differ from node to node and ties are few.
CLUSTER = spec(*(gpu_node(f"t4-{i}", *[(T4, T4_MIB)] * 2, cpu="32") for i in range(4)),
               *(gpu_node(f"v100-{i}", *[(V100_32, V100_32_MIB)] * 4, cpu="64") for i in range(3)),
               gpu_node("mixed", (T4, T4_MIB), (V100_32, V100_32_MIB), cpu="16"))
PODS = 40


def _placements(choice: NodeChoice, weight: int = DEFAULT_WEIGHT) -> tuple[dict[str, str | None], dict[str, float]]:
    """Every pod's node after scheduling the same pods in the same order, and the extender's request counts."""
    rng = random.Random(7)
    with LocalCluster(CLUSTER) as cluster:
        core = emptied_core(cluster)
        names = []
        for i in range(PODS):
            count = rng.choice((0, 0, 0, 2))  # 0: one GPU (a gpu-count resource counts against the node's GPUs)
            gib = rng.choice((2, 4, 6, 8, 12)) * max(count, 1)
            name = f"p{i:02d}"
            create_pod(core, pod_body(name, gib, gpu_count=count, cpu=str(rng.choice((1, 2, 4, 8)))))
            names.append(name)
        with running_extender(cluster, ExtenderConfig(node_choice=choice, tie_seed=3)) as url:
            with SchedulerLoop(cluster.api_client(), url + "/gpushare-scheduler", weight=weight, seed=1) as loop:
                placed = {name: loop.schedule_pod(name).node for name in names}
            requests: dict[str, float] = {}
            for line in httpx.get(url + "/metrics").text.splitlines():
                if line.startswith("gpushare_extender_requests_total{"):
                    verb = line.split('verb="', 1)[1].split('"', 1)[0]
                    requests[verb] = requests.get(verb, 0.0) + float(line.rsplit(" ", 1)[1])
    return placed, requests


def test_choosing_in_filter_binds_where_prioritize_would_with_one_call_less() -> None:
    in_filter, filter_calls = _placements(NodeChoice.FILTER)
    # The favourite gets 10 and every other node at most 9: at this weight the gap outweighs what kube-scheduler's
    # own least-allocated and balanced-allocation scores can add up to.
    in_prioritize, prioritize_calls = _placements(NodeChoice.PRIORITIZE, weight=DECISIVE_EXTENDER_WEIGHT)
    assert in_filter == in_prioritize
    assert sum(node is not None for node in in_filter.values()) > PODS // 2  # most fit: the comparison says much
    assert len(set(in_filter.values())) > 3
    assert filter_calls.get("prioritize", 0) == 0 and filter_calls["filter"] == PODS
    assert prioritize_calls["prioritize"] > PODS // 2


def test_at_the_installed_weight_kube_schedulers_own_scores_outweigh_the_policy_in_prioritize() -> None:
    """What docs/extender.md warns of: the least-allocated score spreads by CPU and memory, the policy packs, and
    the weight the chart and ``gpushare scheduler-config`` give kube-scheduler does not settle it."""
    in_filter, _ = _placements(NodeChoice.FILTER)
    in_prioritize, _ = _placements(NodeChoice.PRIORITIZE)
    assert in_filter != in_prioritize


def test_a_bad_node_choice_is_a_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSHARE_NODE_CHOICE", "scheduler")
    with pytest.raises(ConfigError, match=r"GPUSHARE_NODE_CHOICE='scheduler' is not a node choice; use filter or "
                                          r"prioritize"):
        parse_config([])
    assert parse_config(["--node-choice", "prioritize"]).node_choice is NodeChoice.PRIORITIZE
    monkeypatch.delenv("GPUSHARE_NODE_CHOICE")
    assert parse_config([]).node_choice is NodeChoice.FILTER
