"""Read the gpushare nodes and their pods from the Kubernetes API, for ``kubectl inspect gpushare``.

The cluster is found the way kubectl finds it (``gpushare.kube.client``); every failure becomes a
``ClusterError`` with one sentence for the operator.
"""

from __future__ import annotations

from gpushare.contract import NodeInfo, PodInfo
from gpushare.kube.api import Kube, KubeError, NotFound
from gpushare.kube.client import KubeConfigError, connect
from gpushare.kube.convert import node_info, pod_info
from inspect_cli.report import is_gpushare_node

# Listing every pod of a large cluster takes a while; the default timeout is for single objects.
REQUEST_TIMEOUT_S = 30.0


class ClusterError(Exception):
    """The cluster could not be read; the text says why and what to check."""


def open_cluster(kubeconfig: str | None = None, context: str | None = None) -> Kube:
    try:
        return connect(kubeconfig, context)
    except KubeConfigError as exc:
        raise ClusterError(str(exc)) from None


def read_cluster(kube: Kube, node_name: str | None = None) -> tuple[list[NodeInfo], list[PodInfo]]:
    """The gpushare nodes (or just ``node_name``) and the pods bound to them."""
    try:
        if node_name:
            try:
                nodes = [node_info(kube.nodes.read(node_name, timeout_s=REQUEST_TIMEOUT_S))]
            except NotFound:
                raise ClusterError(f"Node {node_name!r} does not exist; run 'kubectl get nodes' to list the "
                                   "nodes.") from None
            if not is_gpushare_node(nodes[0]):
                raise ClusterError(f"Node {node_name!r} has no GPUs that gpushare manages (no gpushare=true label "
                                   "and no aliyun.com/gpu-mem capacity).")
            pods_raw = kube.pods.list(field_selector=f"spec.nodeName={node_name}", timeout_s=REQUEST_TIMEOUT_S)
        else:
            nodes = [n for n in map(node_info, kube.nodes.list(timeout_s=REQUEST_TIMEOUT_S)) if is_gpushare_node(n)]
            pods_raw = kube.pods.list(timeout_s=REQUEST_TIMEOUT_S)
    except KubeError as exc:
        raise ClusterError(str(exc)) from None
    names = {n.name for n in nodes}
    pods = [p for p in map(pod_info, pods_raw) if p.node_name in names]
    return nodes, pods
