"""Shared fixtures: a running local cluster, and a helper to describe one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpushare.clusterspec import ClusterSpec
from gpushare.localcluster import LocalCluster


def cluster_spec(nodes: int = 2, gpus: int = 2, memory_mib: int = 16160, model: str = "Tesla-V100-SXM2-16GB",
                 prefix: str = "node") -> ClusterSpec:
    """``nodes`` identical nodes named ``{prefix}-0``..., each with ``gpus`` GPUs on NUMA node 0."""
    return ClusterSpec.model_validate({"nodes": [
        {"name": f"{prefix}-{i}", "gpus": [{"model": model, "memoryMiB": memory_mib, "numa": 0}] * gpus}
        for i in range(nodes)]})


@pytest.fixture
def local_cluster() -> Iterator[LocalCluster]:
    """A local API server with ``cluster_spec()``'s two nodes, inventory published."""
    with LocalCluster(cluster_spec()) as cluster:
        yield cluster
