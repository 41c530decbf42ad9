"""Shared by the extender and scheduler-loop tests: a real uvicorn server for the extender, pods to bind.

(No tests here; the module name keeps it with the extender's tests.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import orjson
import uvicorn
from kubernetes import client

from extender.app import create_app
from extender.config import ExtenderConfig
from gpushare.clusterspec import ClusterSpec, GPUSpec, NodeSpec
from gpushare.kube.api import Kube, Pods
from gpushare.localcluster import LocalCluster

T4 = "Tesla-T4"
T4_MIB = 15360  # 15 GiB
V100_32 = "Tesla-V100-SXM2-32GB"
V100_32_MIB = 32768


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """Run an ASGI app on 127.0.0.1:<ephemeral> in a thread; yields its base URL."""
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and without it
    # every response waits ~40 ms for the client's delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the extender did not start"
        time.sleep(0.005)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


@contextmanager
def running_extender(cluster: LocalCluster, config: ExtenderConfig | None = None,
                     pods: Pods | None = None) -> Iterator[str]:
    """The extender against ``cluster``, served over HTTP and ready (its caches synced).

    ``pods`` replaces the extender's pod calls: a subclass of ``Pods`` stages races against the real cluster.
    """
    kube = Kube.from_api_client(cluster.api_client())
    if pods is not None:
        kube = dataclasses.replace(kube, pods=pods)
    app = create_app(config or ExtenderConfig(), kube)
    with serve(app) as url:
        deadline = time.monotonic() + 20
        while httpx.get(url + "/readyz").status_code != 200:
            assert time.monotonic() < deadline, "the extender never became ready"
            time.sleep(0.01)
        yield url


def emptied_core(cluster: LocalCluster) -> client.CoreV1Api:
    """The cluster's CoreV1Api with every pod of the default namespace deleted: a test starts from no pods."""
    api = client.CoreV1Api(cluster.api_client())
    api.delete_collection_namespaced_pod("default", grace_period_seconds=0)
    return api


def gpu_node(name: str, *gpus: tuple[str, int], cpu: str = "32") -> NodeSpec:
    return NodeSpec(name=name, cpu=cpu, gpus=[GPUSpec(model=m, memoryMiB=mib) for m, mib in gpus])


def spec(*nodes: NodeSpec) -> ClusterSpec:
    return ClusterSpec(nodes=list(nodes))


def pod_body(name: str, gpu_mem: int | list[int] = 0, gpu_count: int = 0, annotations: dict[str, str] | None = None,
             cpu: str = "100m", node: str | None = None, extra_annotations: dict[str, str] | None = None
             ) -> dict[str, Any]:
    """A pod manifest; a list of ``gpu_mem`` makes one container per entry."""
    shares = gpu_mem if isinstance(gpu_mem, list) else [gpu_mem]
    containers = []
    for i, units in enumerate(shares):
        limits = {}
        if units:
            limits["aliyun.com/gpu-mem"] = str(units)
        if gpu_count and i == 0:
            limits["aliyun.com/gpu-count"] = str(gpu_count)
        containers.append({"name": f"c{i}", "image": "busybox",
                           "resources": {"limits": limits, "requests": {"cpu": cpu}}})
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": name, "namespace": "default",
                                         "annotations": {**(annotations or {}), **(extra_annotations or {})}},
                            "spec": {"containers": containers}}
    if node:
        body["spec"]["nodeName"] = node
    return body


def create_pod(core: Any, body: dict[str, Any]) -> dict[str, Any]:
    response = core.create_namespaced_pod("default", body, _preload_content=False)
    created: dict[str, Any] = orjson.loads(response.data)
    return created


def read_pod(core: client.CoreV1Api, name: str) -> dict[str, Any]:
    response: Any = core.read_namespaced_pod(name, "default", _preload_content=False)
    pod: dict[str, Any] = orjson.loads(response.data)
    return pod


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def metric(url: str, name: str) -> float:
    """A sample of ``url``'s /metrics by its name with labels, as Prometheus prints it; 0 when there is none."""
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def free_port() -> int:
    """A loopback port that nothing listens on (until something takes it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port
