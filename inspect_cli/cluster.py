"""Read nodes and pods from the Kubernetes API, the way kubectl finds its cluster.

Config precedence: an explicit ``--kubeconfig``/``--context``, else the in-cluster service account when running
in a pod, else the default kubeconfig (``$KUBECONFIG`` or ``~/.kube/config``). Every failure becomes a
``ClusterError`` with one sentence for the operator.
"""

from __future__ import annotations

import json
import os
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from gpushare.contract import NodeInfo, PodInfo
from gpushare.kube.convert import node_info, pod_info
from inspect_cli.report import is_gpushare_node

REQUEST_TIMEOUT_S = 30


class ClusterError(Exception):
    """The cluster could not be read; the text says why and what to check."""


def _load_in_cluster(configuration: client.Configuration) -> bool:
    if "KUBERNETES_SERVICE_HOST" not in os.environ:
        return False
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except ConfigException:
        return False
    return True


def api_client(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    configuration = client.Configuration()
    explicit = bool(kubeconfig or context)
    if explicit or not _load_in_cluster(configuration):
        try:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=configuration)
        except (ConfigException, OSError) as exc:
            where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
            raise ClusterError(f"Cannot load the Kubernetes configuration from {where} ({exc}); pass --kubeconfig "
                               "or --context to choose a cluster.") from None
    # One attempt: an unreachable cluster should fail in seconds, not after urllib3's retries.
    configuration.retries = False
    return client.ApiClient(configuration)


def _describe(exc: Exception, host: str) -> str:
    if isinstance(exc, ApiException):
        if exc.status in (401, 403):
            return (f"The API server at {host} refused the request ({exc.status} {exc.reason}); check that your "
                    "credentials may get and list nodes and pods.")
        return f"The API server at {host} answered {exc.status} {exc.reason}."
    if isinstance(exc, ValueError):
        return f"The server at {host} answered with something other than Kubernetes JSON; check the server URL."
    # urllib3 prefixes the cause with the connection's repr; the host is already in the sentence.
    reason = str(getattr(exc, "reason", None) or exc).rsplit("): ", 1)[-1]
    return (f"Cannot reach the Kubernetes API server at {host} ({reason}); check the kubeconfig context and that "
            "the cluster is running.")


def _call(api: client.ApiClient, method: Any, *args: Any, not_found: str = "", **kwargs: Any) -> dict[str, Any]:
    """Fetch raw JSON: many thousands of pods parse far faster than through the client's model classes."""
    try:
        response = method(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S, **kwargs)
        data: dict[str, Any] = json.loads(response.data)
        return data
    except ApiException as exc:
        if exc.status == 404 and not_found:
            raise ClusterError(not_found) from None
        raise ClusterError(_describe(exc, api.configuration.host)) from None
    except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
        raise ClusterError(_describe(exc, api.configuration.host)) from None


def read_cluster(api: client.ApiClient, node_name: str | None = None) -> tuple[list[NodeInfo], list[PodInfo]]:
    """The gpushare nodes (or just ``node_name``) and the pods bound to them."""
    core = client.CoreV1Api(api)
    if node_name:
        raw = _call(api, core.read_node, node_name,
                    not_found=f"Node {node_name!r} does not exist; run 'kubectl get nodes' to list the nodes.")
        nodes = [node_info(raw)]
        if not is_gpushare_node(nodes[0]):
            raise ClusterError(f"Node {node_name!r} has no GPUs that gpushare manages (no gpushare=true label and "
                               "no aliyun.com/gpu-mem capacity).")
        pods_raw = _call(api, core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node_name}")
    else:
        nodes = [n for n in (node_info(item) for item in _call(api, core.list_node).get("items") or ())
                 if is_gpushare_node(n)]
        pods_raw = _call(api, core.list_pod_for_all_namespaces)
    names = {n.name for n in nodes}
    pods = [p for p in (pod_info(item) for item in pods_raw.get("items") or ()) if p.node_name in names]
    return nodes, pods
