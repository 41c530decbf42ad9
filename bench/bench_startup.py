"""Benchmark the extender's start-up: the initial node and pod lists, paged against unpaged.

    .venv/bin/python bench/bench_startup.py [--nodes 15000] [--pods 60000] [--page-size 500]

A small HTTP server in this process answers the two list calls the extender makes at start-up (nodes, then
pods of all namespaces) from pre-rendered JSON, honouring ``limit`` and ``continue`` as the API server does,
and holds watches open. Its objects look like a real cluster's, not like test fixtures: nodes carry labels,
conditions, a list of cached images and gpushare's GPU inventory; pods carry ``managedFields``, owner
references, environment variables, projected service-account volumes, tolerations, conditions and container
statuses, a few kB each as ``kubectl get pod -o json`` shows them. A third of the pods are gpushare pods bound
with the annotations the extender writes.

For each mode a fresh child process builds exactly what ``extender.app.create_app`` builds for the watch (a
``ClusterCache`` fed by ``ClusterWatch`` over the production client) and reports how long it took to be ready
(cache synced) and its peak resident memory (``VmHWM``). "unpaged" is the extender before paging: the same
code, with ``limit``/``continue`` removed from its list calls, so each list is one reply.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
GPUS_PER_NODE = 8
GPU_MIB = 16384


def node(k: int) -> dict[str, Any]:
    from gpushare.clusterspec import GPUSpec, NodeSpec
    from gpushare.localcluster.nodes import node_object

    spec = NodeSpec(name=f"node-{k:05d}", cpu="96", memory="512Gi",
                    gpus=[GPUSpec(model="Tesla-V100-SXM2-16GB", memoryMiB=GPU_MIB)] * GPUS_PER_NODE)
    obj = node_object(spec, k, True)
    meta = obj["metadata"]
    meta.update(uid=f"00000000-0000-4000-8000-{k:012d}", resourceVersion=str(1000 + k),
                creationTimestamp="2024-05-01T10:00:00Z")
    meta.setdefault("labels", {}).update({
        "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux", "kubernetes.io/hostname": meta["name"],
        "node.kubernetes.io/instance-type": "p3.16xlarge", "topology.kubernetes.io/zone": f"zone-{k % 3}",
        "topology.kubernetes.io/region": "region-1", "nvidia.com/gpu.present": "true"})
    status = obj.setdefault("status", {})
    status["conditions"] = [{"type": t, "status": "False" if t != "Ready" else "True", "reason": f"Kubelet{t}",
                             "message": f"kubelet reports {t}", "lastHeartbeatTime": "2024-05-01T10:00:00Z",
                             "lastTransitionTime": "2024-05-01T10:00:00Z"}
                            for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")]
    status["images"] = [{"names": [f"registry.example.com/team-{i}/app@sha256:{i:064x}",
                                   f"registry.example.com/team-{i}/app:v{i}"], "sizeBytes": 100_000_000 + i}
                        for i in range(12)]
    status["nodeInfo"] = {"kubeletVersion": "v1.30.4", "containerRuntimeVersion": "containerd://1.7.20",
                          "kernelVersion": "6.1.0-23-amd64", "osImage": "Debian GNU/Linux 12 (bookworm)",
                          "operatingSystem": "linux", "architecture": "amd64", "machineID": f"{k:032x}",
                          "systemUUID": f"{k:032x}", "bootID": f"{k:032x}", "kubeProxyVersion": "v1.30.4"}
    status["addresses"] = [{"type": "InternalIP", "address": f"10.{k // 65536}.{k // 256 % 256}.{k % 256}"},
                           {"type": "Hostname", "address": meta["name"]}]
    return obj


def pod_template() -> dict[str, Any]:
    """One pod of a Deployment as the API server returns it, with the fields that make real pods big."""
    env: list[dict[str, Any]] = [{"name": f"SETTING_{i}", "value": f"value-{i}-" + "x" * 24} for i in range(16)]
    env.append({"name": "POD_IP", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}}})
    container = {"name": "main", "image": "registry.example.com/team/app:v1.2.3", "imagePullPolicy": "IfNotPresent",
                 "args": ["--config=/etc/app/config.yaml", "--port=8080"], "env": env,
                 "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                 "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
                 "volumeMounts": [{"name": "config", "mountPath": "/etc/app"},
                                  {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/"
                                   "serviceaccount", "readOnly": True}],
                 "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080, "scheme": "HTTP"},
                                    "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1,
                                    "failureThreshold": 3},
                 "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}
    managed = {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}},
                              "f:ownerReferences": {".": {}, 'k:{"uid":"x"}': {}}},
               "f:spec": {"f:containers": {'k:{"name":"main"}': {".": {}, "f:args": {}, "f:env": {
                   f'k:{{"name":"SETTING_{i}"}}': {".": {}, "f:name": {}, "f:value": {}} for i in range(16)}}}}}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "generateName": "app-7d9c6b5f4-", "namespace": "team", "resourceVersion": "1",
            "creationTimestamp": "2024-05-01T10:00:00Z",
            "labels": {"app": "app", "pod-template-hash": "7d9c6b5f4", "team": "research"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "app-7d9c6b5f4",
                                 "uid": "11111111-2222-4333-8444-555555555555", "controller": True,
                                 "blockOwnerDeletion": True}],
            "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                 "time": "2024-05-01T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": managed},
                {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": "2024-05-01T10:00:05Z",
                 "fieldsType": "FieldsV1", "subresource": "status",
                 "fieldsV1": {"f:status": {"f:conditions": {f'k:{{"type":"{t}"}}': {".": {}, "f:status": {}}
                                                            for t in ("Ready", "PodScheduled", "Initialized")}}}}]},
        "spec": {
            "containers": [container],
            "volumes": [{"name": "config", "configMap": {"name": "app-config", "defaultMode": 420}},
                        {"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt",
                                                                                  "path": "ca.crt"}]}},
                            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                                "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "serviceAccount": "default", "securityContext": {},
            "schedulerName": "default-scheduler", "priority": 0, "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
            "tolerations": [{"key": f"node.kubernetes.io/{t}", "operator": "Exists", "effect": "NoExecute",
                             "tolerationSeconds": 300} for t in ("not-ready", "unreachable")]},
        "status": {
            "phase": "Running", "qosClass": "Burstable", "hostIP": "10.0.0.1", "podIP": "10.244.0.1",
            "startTime": "2024-05-01T10:00:01Z",
            "conditions": [{"type": t, "status": "True", "lastProbeTime": None,
                            "lastTransitionTime": "2024-05-01T10:00:05Z"}
                           for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                                     "PodScheduled")],
            "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0, "started": True,
                                   "image": "registry.example.com/team/app:v1.2.3",
                                   "imageID": "registry.example.com/team/app@sha256:" + "a" * 64,
                                   "containerID": "containerd://" + "b" * 64,
                                   "state": {"running": {"startedAt": "2024-05-01T10:00:04Z"}},
                                   "lastState": {}}]},
    }


def pods(count: int, nodes: int) -> list[dict[str, Any]]:
    from gpushare.contract import MemoryUnit, new_assignment, parse_request
    from gpushare.kube.convert import pod_info

    template = pod_template()
    out = []
    for i in range(count):
        obj = copy.deepcopy(template)
        meta, spec = obj["metadata"], obj["spec"]
        meta.update(name=f"app-7d9c6b5f4-{i:06d}", uid=f"22222222-0000-4000-8000-{i:012d}",
                    resourceVersion=str(100_000 + i))
        spec["nodeName"] = f"node-{i % nodes:05d}"
        if i % 3 == 0:  # a gpushare pod: 4 GiB on one GPU, bound and annotated as the extender's bind leaves it
            spec["containers"][0]["resources"]["limits"]["aliyun.com/gpu-mem"] = "4"
            request = parse_request(pod_info(obj))
            gpu = (i // nodes) % GPUS_PER_NODE
            meta["annotations"] = new_assignment(request, (gpu,), 16, MemoryUnit.GiB, 1_714_557_600_000_000_000
                                                 ).annotations()
        out.append(obj)
    return out


class Pages:
    """Pre-rendered list replies: page ``i`` of ``size`` objects, and the whole list in one reply."""

    def __init__(self, kind: str, items: list[dict[str, Any]], size: int) -> None:
        self.size = size
        self.pages = [self._reply(kind, items[i:i + size], i + size if i + size < len(items) else None,
                                  len(items) - i - size) for i in range(0, len(items), size)]
        self.whole = self._reply(kind, items, None, 0)

    @staticmethod
    def _reply(kind: str, items: list[dict[str, Any]], next_start: int | None, remaining: int) -> bytes:
        meta: dict[str, Any] = {"resourceVersion": "500000"}
        if next_start is not None:
            meta["continue"] = str(next_start)
            meta["remainingItemCount"] = remaining
        return orjson.dumps({"kind": kind, "apiVersion": "v1", "metadata": meta, "items": items})


def serve(lists: dict[str, Pages]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            pages = lists[url.path]
            if query.get("watch") in ("true", "1"):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                time.sleep(float(query.get("timeoutSeconds", "60")))
                return
            if "limit" in query:
                assert int(query["limit"]) == pages.size, "the bench renders pages of --page-size objects"
                body = pages.pages[int(query.get("continue") or 0) // pages.size]
            else:
                body = pages.whole
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def peak_rss_mib() -> float:
    """This process's peak resident memory. VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss across
    exec, so a child of this (large) parent would report the parent's size."""
    status = Path("/proc/self/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) / 1024


def child(mode: str, kubeconfig: str) -> None:
    """Build the extender's watch and cache as create_app does; report readiness time and peak memory."""
    from gpushare.cache.state import ClusterCache
    from gpushare.contract import MemoryUnit
    from gpushare.kube.api import ListCall
    from gpushare.kube.client import connect
    from gpushare.kube.watch import ClusterWatch

    kube = connect(kubeconfig)
    before = peak_rss_mib()

    def unpaged(call: ListCall) -> ListCall:
        def whole(**options: Any) -> Any:
            options.pop("limit", None)
            options.pop("_continue", None)
            return call(**options)
        return whole

    list_nodes, list_pods = kube.nodes.list_call, kube.pods.list_call
    if mode == "unpaged":
        list_nodes, list_pods = unpaged(list_nodes), unpaged(list_pods)
    started = time.perf_counter()
    watch = ClusterWatch(list_nodes, list_pods, ClusterCache(MemoryUnit.GiB))
    watch.start()
    if not watch.wait_synced(1800):
        raise SystemExit("the extender's cache did not sync within 30 minutes")
    ready = time.perf_counter() - started
    print(json.dumps({"ready_s": ready, "peak_mib": peak_rss_mib(), "before_mib": before}), flush=True)
    os._exit(0)  # the watches are held open by the server; nothing else to wait for


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=15000)
    parser.add_argument("--pods", type=int, default=60000)
    parser.add_argument("--page-size", type=int, default=500, help="must match gpushare.kube.informer.PAGE_SIZE")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "KUBECONFIG"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    sys.path.insert(0, str(ROOT))
    from gpushare.kube.informer import PAGE_SIZE

    if args.page_size != PAGE_SIZE:
        parser.error(f"--page-size must be the informer's page size, {PAGE_SIZE}")
    started = time.perf_counter()
    node_items = [node(k) for k in range(args.nodes)]
    pod_items = pods(args.pods, args.nodes)
    lists = {"/api/v1/nodes": Pages("NodeList", node_items, args.page_size),
             "/api/v1/pods": Pages("PodList", pod_items, args.page_size)}
    sizes = {path: len(p.whole) for path, p in lists.items()}
    print(f"{args.nodes} nodes ({sizes['/api/v1/nodes'] / args.nodes / 1024:.1f} kB each as JSON), {args.pods} pods "
          f"({sizes['/api/v1/pods'] / args.pods / 1024:.1f} kB each; the pod list is "
          f"{sizes['/api/v1/pods'] / 2**20:.0f} MiB), built in {time.perf_counter() - started:.0f} s")
    del node_items, pod_items
    server = serve(lists)
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "bench",
            "clusters": [{"name": "bench", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
            "users": [{"name": "bench", "user": {}}],
            "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}]}))
        print(f"\n{'mode':<10} {'pages':>6} {'ready s':>8} {'peak RSS MiB':>13} {'of which at import':>19}")
        for mode in ("unpaged", "paged"):
            result = subprocess.run([sys.executable, __file__, "--child", mode, str(kubeconfig)], capture_output=True,
                                    text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
            figures = json.loads(result.stdout.strip().splitlines()[-1])
            pages = 1 + 1 if mode == "unpaged" else len(lists["/api/v1/nodes"].pages) + len(lists["/api/v1/pods"].pages)
            print(f"{mode:<10} {pages:>6} {figures['ready_s']:>8.1f} {figures['peak_mib']:>13.0f} "
                  f"{figures['before_mib']:>19.0f}", flush=True)
    server.shutdown()


if __name__ == "__main__":
    main()
