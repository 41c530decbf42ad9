"""The extender's per-model GPU gauges, summed per node state: equal to the node-by-node sums in every state."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from test_cache import gpu_pod, node_info

from extender.metrics import ExtenderMetrics
from gpushare.cache.state import ClusterCache
from gpushare.model import Node

GAUGES = ("gpushare_cluster_gpus", "gpushare_cluster_idle_gpus", "gpushare_cluster_gpu_memory_mib",
          "gpushare_cluster_gpu_memory_allocated_mib")


def gauges(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    return {(sample.name, sample.labels["model"]): sample.value
            for family in registry.collect() if family.name in GAUGES for sample in family.samples}


def node_by_node(cache: ClusterCache) -> dict[tuple[str, str], float]:
    """The gauges as a sum over every node, each read on its own (GiB nodes: 1 unit is 1,024 MiB)."""

    def rows(node: Node) -> list[tuple[str, int, int, int]]:
        return [(g.model, int(g.used == 0 and g.holders == 0), g.total * node.unit.mib, g.used * node.unit.mib)
                for g in node.gpus if g.healthy]

    out: dict[tuple[str, str], float] = {}
    for node_rows in cache.evaluate(cache.node_names(), rows).values():
        for model, idle, mib, allocated in node_rows or []:
            for name, value in zip(GAUGES, (1, idle, mib, allocated), strict=True):
                out[name, model] = out.get((name, model), 0) + value
    return out


@settings(max_examples=60, deadline=None)
@given(twins=st.integers(1, 6),
       placements=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 1), st.integers(1, 8)), max_size=10),
       scrape_between=st.booleans())
def test_gauges_summed_per_state_equal_the_sums_node_by_node(twins: int, placements: list[tuple[int, int, int]],
                                                             scrape_between: bool) -> None:
    cache = ClusterCache()
    for i in range(twins):  # identical nodes: one state until pods tell them apart
        cache.upsert_node(node_info(f"twin-{i}", [16384, 16384]))
    cache.upsert_node(node_info("mixed", [16384, 32768], ["Tesla-T4", "Tesla-V100-SXM2-32GB"]))
    metrics = ExtenderMetrics(cache, lambda: True, CollectorRegistry())
    nodes = [f"twin-{i}" for i in range(twins)] + ["mixed"]
    for n, (node, gpu, units) in enumerate(placements):
        if scrape_between:  # the totals of states seen at an earlier scrape are remembered
            assert gauges(metrics.registry) == node_by_node(cache)
        cache.upsert_pod(gpu_pod(f"p{n}", units, node=nodes[node % len(nodes)], gpus=(gpu,), phase="Running"))
    assert gauges(metrics.registry) == node_by_node(cache)
    assert sum(v for (name, _), v in gauges(metrics.registry).items() if name == GAUGES[0]) == 2 * twins + 2
