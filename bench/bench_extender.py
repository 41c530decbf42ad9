"""Benchmark the extender against a large local cluster and print the figures.

    .venv/bin/python bench/bench_extender.py [--nodes 5000] [--requests 300] [--binds 400]

A local API server holds ``--nodes`` nodes of 8 x 16 GiB GPUs, half of their GPU memory taken by bound pods
(annotated as gpushare's bind writes them). The extender runs as a subprocess built by the same app factory
as production, plus one extra route mounted here only: ``/echo``, which parses the body with orjson and
returns it re-serialised. Its latency is the floor that any JSON route of this app pays for the same body
over the same HTTP stack, so the filter's cost is reported as a ratio against it.

Measured: filter latency (median, p99) with nodeCacheCapable (all node names in each request) for a pod
that fits nearly everywhere and for one that fails on a fifth of the nodes; the echo floor; bind
throughput through the local API server (sequential and 8 concurrent); the extender's resident memory.
"""

from __future__ import annotations

import argparse
import gc
import http.client
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
from fastapi import Request, Response

NODE_GPUS = 8
GPU_MIB = 16384
LEVELS_GIB = (0, 4, 8, 12, 16)  # per-GPU use across the cluster averages 8 of 16 GiB: half full


def gpu_pod(name: str, gpu_mem: int, gpu_count: int = 1, node: str | None = None,
            annotations: dict[str, str] | None = None) -> dict[str, Any]:
    limits = {"aliyun.com/gpu-mem": str(gpu_mem)}
    if gpu_count > 1:
        limits["aliyun.com/gpu-count"] = str(gpu_count)
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox",
                                            "resources": {"limits": limits, "requests": {"cpu": "100m"}}}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "spec": spec,
            "metadata": {"name": name, "namespace": "default", "annotations": annotations or {}}}


def populate(core: Any, nodes: int) -> int:
    """Bind pods two GPUs at a time so that GPU pair j of node k holds LEVELS_GIB[(k + j) % 5] per GPU."""
    from gpushare.contract import MemoryUnit, new_assignment, parse_request
    from gpushare.kube.convert import pod_info

    bodies = []
    for k in range(nodes):
        for pair in range(NODE_GPUS // 2):
            level = LEVELS_GIB[(k + pair) % len(LEVELS_GIB)]
            if not level:
                continue
            body = gpu_pod(f"fill-{k}-{pair}", 2 * level, 2, node=f"node-{k}")
            request = parse_request(pod_info(body))
            assignment = new_assignment(request, (2 * pair, 2 * pair + 1), 16, MemoryUnit.GiB, time.time_ns())
            body["metadata"]["annotations"] = assignment.annotations()
            bodies.append(body)

    def create(body: dict[str, Any]) -> None:
        core.create_namespaced_pod("default", body, _preload_content=False)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, bodies))
    return len(bodies)


def serve_extender(kubeconfig: str) -> None:
    """Child process: the production app plus the echo floor, on an ephemeral port printed to stdout."""
    import uvicorn

    from extender.app import create_app
    from extender.config import ExtenderConfig
    from gpushare.kube.client import connect
    from gpushare.logs import configure_logging

    configure_logging("WARNING")
    app = create_app(ExtenderConfig(), connect(kubeconfig))

    @app.app.post("/echo")
    async def echo(request: Request) -> Response:
        return Response(orjson.dumps(orjson.loads(await request.body())), media_type="application/json")

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    print(sock.getsockname()[1], flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False))
    server.run(sockets=[sock])


def timed_posts(conn: http.client.HTTPConnection, path: str, bodies: list[bytes], count: int) -> list[float]:
    """POST ``count`` requests, cycling through ``bodies``; the latency of each, in seconds."""
    out = []
    for i in range(count):
        body = bodies[i % len(bodies)]
        start = time.perf_counter()
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        out.append(time.perf_counter() - start)
        if response.status != 200:
            raise RuntimeError(f"{path} answered {response.status}: {data[:300]!r}")
    return out


def p99(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=100)[98]


def rss_mib(pid: int) -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--requests", type=int, default=300, help="timed requests per route and pod shape")
    parser.add_argument("--binds", type=int, default=400, help="pods bound in each bind-throughput run")
    parser.add_argument("--serve-extender", metavar="KUBECONFIG", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_extender:
        serve_extender(args.serve_extender)
        return

    from kubernetes import client

    from gpushare.clusterspec import ClusterSpec, GPUSpec, NodeSpec
    from gpushare.localcluster import LocalCluster

    spec = ClusterSpec(nodes=[NodeSpec(name=f"node-{k}", cpu="96", memory="512Gi",
                                       gpus=[GPUSpec(model="Tesla-V100-SXM2-16GB", memoryMiB=GPU_MIB)] * NODE_GPUS)
                              for k in range(args.nodes)])
    started = time.perf_counter()
    with LocalCluster(spec) as cluster, tempfile.TemporaryDirectory() as tmp:
        core = client.CoreV1Api(cluster.api_client())
        pods = populate(core, args.nodes)
        # The local API server in this process now holds every object; keep the collector from walking
        # them in the middle of a timed request.
        gc.collect()
        gc.freeze()
        print(f"cluster: {args.nodes} nodes x {NODE_GPUS} GPUs of 16 GiB, {pods} bound pods, half the GPU memory "
              f"in use (built in {time.perf_counter() - started:.0f} s)")
        kubeconfig = str(cluster.write_kubeconfig(Path(tmp) / "kubeconfig"))
        child = subprocess.Popen([sys.executable, __file__, "--serve-extender", kubeconfig], stdout=subprocess.PIPE,
                                 env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
        try:
            assert child.stdout is not None
            port = int(child.stdout.readline())
            run(args, core, child.pid, port)
        finally:
            child.terminate()
            child.wait(timeout=30)


def run(args: argparse.Namespace, core: Any, pid: int, port: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    ready_started = time.perf_counter()
    while True:
        try:
            conn.request("GET", "/readyz")
            response = conn.getresponse()
            response.read()
            if response.status == 200:
                break
        except (ConnectionError, http.client.HTTPException):
            conn.close()
        time.sleep(0.05)
    print(f"extender ready (cache synced) {time.perf_counter() - ready_started:.1f} s after start")

    names = [f"node-{k}" for k in range(args.nodes)]
    shapes = {
        "4 GiB on 1 GPU (fits every node)": gpu_pod("probe-small", 4),
        "2 GPUs x 16 GiB (fails on 1/5 of nodes)": gpu_pod("probe-wide", 32, 2),
    }
    rounds = 3  # interleaved, so that drift on a busy machine hits every route alike
    per_round = max(args.requests // rounds, 1)
    print(f"\nfilter, nodeCacheCapable: true, {args.nodes} NodeNames per request, {per_round * rounds} requests each")
    print(f"{'route':<52} {'median ms':>10} {'p99 ms':>10} {'vs echo':>8}")
    results: dict[str, list[float]] = {}
    for label, pod in shapes.items():
        created: Any = core.create_namespaced_pod("default", pod, _preload_content=False)
        pod_json = orjson.loads(created.data)
        same = [orjson.dumps({"Pod": pod_json, "Nodes": None, "NodeNames": names})]
        # Rotating the names defeats the extender's reuse of its previous answer: every request is computed.
        rotated = [orjson.dumps({"Pod": pod_json, "Nodes": None, "NodeNames": names[i:] + names[:i]})
                   for i in range(1, per_round + 1)]
        routes = {"echo floor (parse + serialise the same body)": ("/echo", same),
                  "filter, same names each request": ("/gpushare-scheduler/filter", same),
                  "filter, names rotated each request (no reuse)": ("/gpushare-scheduler/filter", rotated)}
        samples: dict[str, list[float]] = {name: [] for name in routes}
        for path, bodies in routes.values():
            timed_posts(conn, path, bodies, 30)
        for _ in range(rounds):
            for name, (path, bodies) in routes.items():
                samples[name] += timed_posts(conn, path, bodies, per_round)
        print(f"{label}:")
        echo = samples["echo floor (parse + serialise the same body)"]
        for name, values in samples.items():
            print(f"  {name:<50} {statistics.median(values) * 1e3:>10.2f} {p99(values) * 1e3:>10.2f} "
                  f"{p99(values) / p99(echo):>7.2f}x")
            results[f"{label}: {name}"] = values

    prioritize_body = orjson.dumps({"Pod": pod_json, "Nodes": None, "NodeNames": names})
    timed = timed_posts(conn, "/gpushare-scheduler/prioritize", [prioritize_body], 20)
    print(f"\nprioritize, {args.nodes} NodeNames, binpack: median {statistics.median(timed) * 1e3:.1f} ms, "
          f"max {max(timed) * 1e3:.1f} ms")

    print(f"\nbind through the local API server ({args.binds} pods of 4 GiB each run)")
    for threads in (1, 8):
        pending = [orjson.loads(core.create_namespaced_pod(
            "default", gpu_pod(f"bind-{threads}-{i}", 4), _preload_content=False).data) for i in range(args.binds)]
        # kube-scheduler binds only to a node filter passed; the extender refuses any other (its filter ledger),
        # so each pod is filtered on its node first, outside the timed binds.
        for i, pod in enumerate(pending):
            timed_posts(conn, "/gpushare-scheduler/filter",
                        [orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": [names[i % len(names)]]})], 1)

        def bind(item: tuple[int, dict[str, Any]]) -> str:
            i, pod = item
            local = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            local.request("POST", "/gpushare-scheduler/bind", headers={"Content-Type": "application/json"},
                          body=orjson.dumps({"PodName": pod["metadata"]["name"], "PodNamespace": "default",
                                             "PodUID": pod["metadata"]["uid"], "Node": names[i % len(names)]}))
            answer = orjson.loads(local.getresponse().read())
            local.close()
            return str(answer["Error"])

        started = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            errors = [e for e in pool.map(bind, enumerate(pending)) if e]
        elapsed = time.perf_counter() - started
        print(f"  {threads} client thread(s): {args.binds / elapsed:7.0f} binds/s ({len(errors)} failed)")
        if errors:
            print(f"    first error: {errors[0]}")

    rss, peak = rss_mib(pid)
    print(f"\nextender memory: RSS {rss:.0f} MiB now, peak {peak:.0f} MiB")
    worst = max(p99(v) for k, v in results.items() if k.startswith("4 GiB") and "filter" in k)
    floor = p99(results["4 GiB on 1 GPU (fits every node): echo floor (parse + serialise the same body)"])
    met = worst * 1e3 < 15 and worst / floor <= 2 and peak < 300
    print(f"targets for the 4 GiB pod (filter p99 < 15 ms and <= 2x echo, RSS < 300 MB): "
          f"{'met' if met else 'NOT met'} (worst filter p99 {worst * 1e3:.2f} ms = {worst / floor:.2f}x echo)")


if __name__ == "__main__":
    main()
