"""A local Kubernetes API server for tests and the demo: real HTTP, real client, in-memory state."""

from gpushare.localcluster.cluster import LocalCluster

__all__ = ["LocalCluster"]
