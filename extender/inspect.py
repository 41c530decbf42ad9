"""Aliyun's ``/inspect`` view of a node: per GPU, total and used memory and the pods holding it."""

from __future__ import annotations

from typing import Any

from gpushare.cache.state import ClusterCache
from gpushare.model import Node


def inspect_nodes(cache: ClusterCache, name: str | None = None) -> list[dict[str, Any]]:
    """Every node's view (or just ``name``'s), in name order; empty for a node the cache does not know."""
    names = [name] if name is not None else cache.node_names()
    return [view for view in cache.evaluate(names, inspect_node).values() if view is not None]


def inspect_node(node: Node) -> dict[str, Any]:
    devs = []
    for gpu in sorted(node.gpus, key=lambda g: g.index):
        pods = []
        for key, placement in node.placements.items():
            if gpu.index in placement.gpu_indices:
                namespace, _, name = key.partition("/")
                used = gpu.total if placement.exclusive else placement.per_gpu
                pods.append({"name": name, "namespace": namespace, "usedGPU": used})
        devs.append({"id": gpu.index, "totalGPU": gpu.total, "usedGPU": gpu.used,
                     "pods": sorted(pods, key=lambda p: (p["namespace"], p["name"]))})
    return {"name": node.name, "totalGPU": sum(d["totalGPU"] for d in devs),
            "usedGPU": sum(d["usedGPU"] for d in devs), "devs": devs}
