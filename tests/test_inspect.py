"""``kubectl inspect gpushare`` against the local API server, run as kubectl runs plugins: a separate process.

The cluster holds pods annotated the way the extender's bind annotates them. Expected figures (GiB):
node-a, two V100 16 GB (16160 MiB -> 16 GiB): GPU0 4/16 (a-small), GPU1 16/16 (a-whole, exclusive).
node-b, a T4 (15 GiB) and an A100 40 GB: GPU0 3/15 and GPU1 3+8=11/40 (b-pair spans both; b-pending waits for
the device plugin). Cluster: 34/87 (39%).
"""

from __future__ import annotations

import functools
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from gpushare.clusterspec import ClusterSpec
from gpushare.contract import (
    ANN_ASSIGNED,
    ANN_EXCLUSIVE,
    ANN_NODE_INVENTORY,
    MemoryUnit,
    PodRequest,
    decode_inventory,
    encode_inventory,
    new_assignment,
)
from gpushare.localcluster import LocalCluster

BIN = Path(sys.executable).parent
PLUGIN = BIN / "kubectl-inspect-gpushare"
KUBECTL = BIN / "kubectl"

SPEC = ClusterSpec.model_validate({"nodes": [
    {"name": "node-b", "gpus": [{"model": "Tesla-T4", "memoryMiB": 15360},
                                {"model": "A100-SXM4-40GB", "memoryMiB": 40960}]},
    {"name": "node-a", "gpus": [{"model": "Tesla-V100-SXM2-16GB", "memoryMiB": 16160},
                                {"model": "Tesla-V100-SXM2-16GB", "memoryMiB": 16160}]},
    {"name": "cpu-only", "labels": {}},
]})


def gpu_pod(name: str, node: str, memory: int, gpus: list[int], totals: list[int], *, namespace: str = "default",
            assigned: bool = True, exclusive: bool = False, annotate: bool = True) -> dict[str, Any]:
    request = PodRequest(per_gpu=memory // len(gpus), gpu_count=len(gpus), container_shares={"main": memory})
    assignment = new_assignment(request, gpus, totals[0], MemoryUnit.GiB, 1_700_000_000_000_000_000)
    annotations = assignment.annotations() if annotate else {}
    if annotate and assigned:
        annotations[ANN_ASSIGNED] = "true"
    if exclusive:
        annotations[ANN_EXCLUSIVE] = "true"
    limits = {"aliyun.com/gpu-mem": str(memory)}
    if len(gpus) > 1:
        limits["aliyun.com/gpu-count"] = str(len(gpus))
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "cuda",
                                                        "resources": {"limits": limits}}]}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The running cluster's kubeconfig."""
    with LocalCluster(SPEC) as local:
        core = client.CoreV1Api(local.api_client())
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
        for pod in (gpu_pod("a-small", "node-a", 4, [0], [16]),
                    gpu_pod("a-whole", "node-a", 16, [1], [16], namespace="ml", exclusive=True),
                    gpu_pod("a-finished", "node-a", 8, [0], [16]),
                    gpu_pod("a-rogue", "node-a", 2, [0], [16], annotate=False),
                    gpu_pod("b-pair", "node-b", 6, [0, 1], [15, 40]),
                    gpu_pod("b-pending", "node-b", 8, [1], [40], assigned=False)):
            core.create_namespaced_pod(pod["metadata"]["namespace"], pod)
        core.patch_namespaced_pod_status("a-finished", "default", {"status": {"phase": "Succeeded"}})
        node = core.read_node("node-b")
        gpus = decode_inventory(node.metadata.annotations[ANN_NODE_INVENTORY])
        published = [gpus[0].__class__(**{**gpus[0].__dict__, "healthy": False}),
                     gpus[1].__class__(**{**gpus[1].__dict__, "used_mib": 9000})]
        core.patch_node("node-b", {"metadata": {"annotations": {ANN_NODE_INVENTORY: encode_inventory(published)}}})
        yield local.write_kubeconfig(tmp_path_factory.mktemp("kube") / "config")


def inspect(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PLUGIN), "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True,
                          timeout=60, check=False)


@functools.cache
def ok(kubeconfig: Path, *args: str) -> str:
    """Standard output of a successful run; each distinct command runs once per module."""
    result = inspect(kubeconfig, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout


def table(text: str) -> tuple[list[str], dict[str, list[str]]]:
    """Header cells and rows by first cell, from the first block of a tabulate plain table."""
    lines = [line for line in text.split("\n-", 1)[0].strip().splitlines()
             if not line.startswith(("Allocated :", "Total :"))]
    header = [h for h in lines[0].split("  ") if h.strip()]
    rows = {cells[0]: cells for cells in (line.split() for line in lines[1:])}
    return [h.strip() for h in header], rows


def test_summary_keeps_aliyun_layout_with_each_gpus_own_total(cluster: Path) -> None:
    out = ok(cluster)
    header, rows = table(out)
    assert header == ["NAME", "IPADDRESS", "GPU0(Allocated/Total)", "GPU1(Allocated/Total)", "PENDING(Allocated)",
                      "GPU Memory(GiB)"]
    assert list(rows) == ["node-a", "node-b"]
    assert rows["node-a"][2:] == ["4/16", "16/16", "0", "20/32"]
    assert rows["node-b"][2:] == ["3/15", "11/40", "8", "14/55"]
    assert "Allocated/Total GPU Memory In Cluster:\n34/87 (39%)\n" in out
    assert "PENDING(Allocated): memory of pods bound to the node whose GPUs the device plugin has not" in out


def test_pods_that_skipped_the_extender_are_called_out(cluster: Path) -> None:
    out = ok(cluster)
    assert "Pod default/a-rogue on node node-a asks for GPU memory but was not placed by the gpushare extender" in out
    assert "a-finished" not in out


def test_details_list_pods_per_gpu(cluster: Path) -> None:
    out = ok(cluster, "-d")
    node_a, node_b = out.split("NAME:       ")[1:3]
    assert node_a.startswith("node-a\nIPADDRESS:  127.")
    header, rows = table(node_a.split("\n\n", 1)[1])
    assert header == ["NAME", "NAMESPACE", "GPU0(Allocated)", "GPU1(Allocated)"]
    assert rows == {"a-small": ["a-small", "default", "4", "0"], "a-whole": ["a-whole", "ml", "0", "16"]}
    assert "Allocated :  20 (62%)\nTotal :      32" in node_a
    header, rows = table(node_b.split("\n\n", 1)[1])
    assert header == ["NAME", "NAMESPACE", "GPU0(Allocated)", "GPU1(Allocated)", "PENDING(Allocated)"]
    assert rows["b-pair"][1:] == ["default", "3", "3", "0"]
    assert rows["b-pending"][1:] == ["default", "0", "8", "8"]
    assert "\n\nAllocated/Total GPU Memory In Cluster:\n34/87 (39%)\n" in out


def test_wide_shows_model_health_and_nvml_memory(cluster: Path) -> None:
    header, _ = table(ok(cluster, "-o", "wide"))
    assert header == ["NAME", "IPADDRESS", "GPU", "MODEL", "HEALTH", "ALLOCATED/TOTAL(GiB)", "PENDING(GiB)",
                      "NVML USED(MiB)", "PODS"]
    lines = ok(cluster, "-o", "wide").splitlines()[1:5]
    assert [line.split()[2:] for line in lines] == [
        ["0", "Tesla-V100-SXM2-16GB", "Healthy", "4/16", "0", "-", "1"],
        ["1", "Tesla-V100-SXM2-16GB", "Healthy", "16/16", "0", "-", "1"],
        ["0", "Tesla-T4", "Unhealthy", "3/15", "0", "-", "1"],
        ["1", "A100-SXM4-40GB", "Healthy", "11/40", "8", "9000", "2"],
    ]


def test_wide_details_show_gpus_above_pods(cluster: Path) -> None:
    out = ok(cluster, "-d", "-o", "wide", "node-b")
    gpus, pods = out.split("\n\n")[1:3]
    assert gpus.splitlines()[2].split()[2:5] == ["1", "A100-SXM4-40GB", "Healthy"]
    assert pods.splitlines()[0].split()[:2] == ["NAME", "NAMESPACE"]


def test_json_has_every_figure(cluster: Path) -> None:
    data = json.loads(ok(cluster, "-o", "json"))
    assert (data["unit"], data["usedGPU"], data["totalGPU"]) == ("GiB", 34, 87)
    node_b = data["nodes"][1]
    assert (node_b["name"], node_b["usedGPU"], node_b["pendingGPU"]) == ("node-b", 14, 8)
    a100 = node_b["devs"][1]
    assert a100 == {"id": 1, "model": "A100-SXM4-40GB", "healthy": True, "totalGPU": 40, "usedGPU": 11,
                    "pendingGPU": 8, "nvmlUsedMiB": 9000,
                    "pods": [{"name": "b-pair", "namespace": "default", "usedGPU": 3, "assigned": True},
                             {"name": "b-pending", "namespace": "default", "usedGPU": 8, "assigned": False}]}
    assert data["nodes"][0]["unplacedPods"] == ["default/a-rogue"]


def test_yaml_matches_json(cluster: Path) -> None:
    assert yaml.safe_load(ok(cluster, "-o", "yaml", "node-a")) == json.loads(ok(cluster, "-o", "json", "node-a"))


@pytest.mark.parametrize("args", [["-d", "node-b"], ["node-b", "--details"]])
def test_flags_in_any_order(cluster: Path, args: list[str]) -> None:
    out = ok(cluster, *args)
    assert out.startswith("NAME:       node-b\n")
    assert "node-a" not in out


@pytest.mark.parametrize("args", [["-o", "json", "node-a"], ["node-a", "--output=json"]])
def test_output_flag_in_any_order(cluster: Path, args: list[str]) -> None:
    assert [n["name"] for n in json.loads(ok(cluster, *args))["nodes"]] == ["node-a"]


def assert_one_sentence_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 1
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and lines[0].endswith(".")
    for fragment in fragments:
        assert fragment in lines[0]


def test_unknown_node_is_a_clear_error(cluster: Path) -> None:
    assert_one_sentence_error(inspect(cluster, "-d", "no-such-node"), "Node 'no-such-node' does not exist")


def test_node_without_gpus_is_a_clear_error(cluster: Path) -> None:
    assert_one_sentence_error(inspect(cluster, "cpu-only"), "no GPUs that gpushare manages")


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def write_kubeconfig(path: Path, contexts: dict[str, str], current: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": current,
        "clusters": [{"name": name, "cluster": {"server": url}} for name, url in contexts.items()],
        "users": [{"name": "user", "user": {}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": "user"}} for name in contexts],
    }))
    return path


def test_unreachable_cluster_is_a_clear_error(tmp_path: Path) -> None:
    port = closed_port()
    config = write_kubeconfig(tmp_path / "config", {"gone": f"http://127.0.0.1:{port}"}, "gone")
    assert_one_sentence_error(inspect(config), f"Cannot reach the Kubernetes API server at http://127.0.0.1:{port}")


def test_missing_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    assert_one_sentence_error(inspect(tmp_path / "absent"), "Cannot load the Kubernetes configuration")


def test_context_flag_picks_the_cluster(cluster: Path, tmp_path: Path) -> None:
    server = yaml.safe_load(cluster.read_text())["clusters"][0]["cluster"]["server"]
    config = write_kubeconfig(tmp_path / "config", {"gone": f"http://127.0.0.1:{closed_port()}", "local": server},
                              "gone")
    assert inspect(config).returncode == 1
    assert json.loads(ok(config, "--context", "local", "-o", "json"))["usedGPU"] == 34


def kubectl_env(kubeconfig: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    return {**env, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "KUBECONFIG": str(kubeconfig)}


def test_runs_as_a_kubectl_plugin(cluster: Path) -> None:
    result = subprocess.run([str(KUBECTL), "inspect", "gpushare", "node-b", "-d"], capture_output=True, text=True,
                            env=kubectl_env(cluster), timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ok(cluster, "-d", "node-b")


def test_kubectl_plugin_reports_errors(cluster: Path) -> None:
    result = subprocess.run([str(KUBECTL), "inspect", "gpushare", "-o", "json", "ghost"], capture_output=True,
                            text=True, env=kubectl_env(cluster), timeout=60, check=False)
    assert result.returncode == 1
    assert "error: Node 'ghost' does not exist" in result.stderr
