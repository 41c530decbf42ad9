"""The local API server at the HTTP level: discovery, tables, and bad requests that must get clear errors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import cluster_spec

from gpushare.localcluster import LocalCluster

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
       "spec": {"containers": [{"name": "main", "image": "busybox"}]}}


@pytest.fixture
def http(local_cluster: LocalCluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=local_cluster.url, timeout=10) as session:
        yield session


def failure(response: httpx.Response, code: int, reason: str) -> str:
    """Check a response is the API server's Status for a failure; return its message."""
    assert response.status_code == code
    assert response.headers["content-type"] == "application/json"
    status: dict[str, Any] = response.json()
    assert (status["kind"], status["status"], status["code"], status["reason"]) == ("Status", "Failure", code, reason)
    return str(status["message"])


def test_core_discovery_lists_kinds_verbs_and_short_names(http: httpx.Client) -> None:
    assert http.get("/api").json()["versions"] == ["v1"]
    resources = {r["name"]: r for r in http.get("/api/v1").json()["resources"]}
    assert {name: resources[name]["shortNames"] for name in ("pods", "nodes", "namespaces", "configmaps", "events")} \
        == {"pods": ["po"], "nodes": ["no"], "namespaces": ["ns"], "configmaps": ["cm"], "events": ["ev"]}
    assert resources["pods"]["namespaced"] and not resources["nodes"]["namespaced"]
    assert "watch" in resources["pods"]["verbs"] and resources["pods/binding"]["verbs"] == ["create"]
    assert {"pods/status", "nodes/status", "bindings"} <= set(resources)


def test_group_discovery_and_version(http: httpx.Client) -> None:
    groups = http.get("/apis").json()["groups"]
    assert [g["preferredVersion"]["groupVersion"] for g in groups] == [
        "coordination.k8s.io/v1", "scheduling.k8s.io/v1", "policy/v1", "scheduling.x-k8s.io/v1alpha1"]
    leases = http.get("/apis/coordination.k8s.io/v1").json()["resources"]
    assert [(r["name"], r["kind"], r["namespaced"]) for r in leases] == [("leases", "Lease", True)]
    budgets = http.get("/apis/policy/v1").json()["resources"]
    assert [(r["name"], r["kind"], r["namespaced"]) for r in budgets] == [
        ("poddisruptionbudgets", "PodDisruptionBudget", True),
        ("poddisruptionbudgets/status", "PodDisruptionBudget", True)]
    classes = http.get("/apis/scheduling.k8s.io/v1").json()["resources"]
    assert [(r["name"], r["kind"], r["namespaced"]) for r in classes] == [("priorityclasses", "PriorityClass", False)]
    assert http.get("/version").json()["major"] == "1"


def test_table_for_kubectl(http: httpx.Client) -> None:
    accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
    response = http.get("/api/v1/nodes", headers={"Accept": accept})
    assert response.headers["content-type"].startswith("application/json;as=Table")
    table = response.json()
    assert table["kind"] == "Table"
    assert [c["name"] for c in table["columnDefinitions"] if c["priority"] == 0] == [
        "Name", "Status", "Roles", "Age", "Version"]
    assert [row["cells"][:2] for row in table["rows"]] == [["node-0", "Ready"], ["node-1", "Ready"]]
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    assert table["rows"][0]["object"]["metadata"]["name"] == "node-0"


def test_bad_json_is_a_bad_request_and_the_server_keeps_serving(http: httpx.Client) -> None:
    message = failure(http.post("/api/v1/namespaces/default/pods", content=b"{not json",
                                headers={"Content-Type": "application/json"}), 400, "BadRequest")
    assert "not valid JSON" in message
    assert http.get("/api/v1/namespaces/default/pods").status_code == 200


@pytest.mark.parametrize(("body", "code", "words"), [
    (b"[1, 2]", 400, "must be a JSON object"),
    (b"", 400, "has no body"),
    (b'{"kind": "Node", "metadata": {"name": "p"}}', 400, "this URL takes Pod"),
    (b'{"metadata": {"name": "p", "namespace": "other"}, "spec": {}}', 400, "does not match the namespace"),
    (b'{"metadata": "p"}', 400, "metadata must be a JSON object"),
    (b'{"metadata": {"name": "p"}, "spec": {}}', 422, 'Pod "p" is invalid: spec.containers: Required value'),
    # The real server fails to decode a label that is not a string: 400, not 422.
    (b'{"metadata": {"labels": {"a": 1}, "name": "p"}, "spec": {}}', 400,
     "cannot unmarshal number into Go struct field ObjectMeta.metadata.labels of type string"),
    (b'{"spec": {}}', 422, "name or generateName is required"),
])
def test_invalid_pod_bodies(http: httpx.Client, body: bytes, code: int, words: str) -> None:
    response = http.post("/api/v1/namespaces/default/pods", content=body, headers={"Content-Type": "application/json"})
    assert words in failure(response, code, "BadRequest" if code == 400 else "Invalid")


def test_configmap_data_must_be_strings(http: httpx.Client) -> None:
    response = http.post("/api/v1/namespaces/default/configmaps", json={"metadata": {"name": "c"}, "data": {"n": 1}})
    assert "Go struct field ConfigMap.data of type string" in failure(response, 400, "BadRequest")


def test_update_of_another_name_is_a_bad_request(http: httpx.Client) -> None:
    http.post("/api/v1/namespaces/default/pods", json=POD)
    other = {**POD, "metadata": {"name": "q"}}
    message = failure(http.put("/api/v1/namespaces/default/pods/p", json=other), 400, "BadRequest")
    assert message == "the name of the object (q) does not match the name on the URL (p)"


def test_patch_errors(http: httpx.Client) -> None:
    http.post("/api/v1/namespaces/default/pods", json=POD)
    url = "/api/v1/namespaces/default/pods/p"
    message = failure(http.patch(url, content=b"{}", headers={"Content-Type": "application/apply-patch+yaml"}),
                      415, "UnsupportedMediaType")
    assert "application/merge-patch+json" in message
    message = failure(http.patch(url, content=b'{"op": "add"}', headers={"Content-Type":
                                                                       "application/json-patch+json"}),
                      400, "BadRequest")
    assert "JSON list of operations" in message
    message = failure(http.patch(url, content=b'[{"op": "frobnicate", "path": "/x"}]',
                                 headers={"Content-Type": "application/json-patch+json"}), 400, "BadRequest")
    assert "malformed" in message
    message = failure(http.patch(url, content=b'[1]', headers={"Content-Type": "application/merge-patch+json"}),
                      400, "BadRequest")
    assert "must be a JSON object" in message


def test_unknown_paths_and_methods(http: httpx.Client) -> None:
    failure(http.get("/api/v1/widgets"), 404, "NotFound")
    failure(http.get("/apis/apps/v1/deployments"), 404, "NotFound")
    failure(http.get("/api/v1/namespaces/default/nodes"), 404, "NotFound")
    failure(http.get("/api/v1/pods/p"), 404, "NotFound")
    failure(http.get("/openapi/v3"), 404, "NotFound")
    failure(http.put("/api/v1/namespaces/default/pods", json=POD), 405, "MethodNotAllowed")
    failure(http.get("/api/v1/namespaces/default/pods/p/binding"), 405, "MethodNotAllowed")
    failure(http.post("/api/v1/pods", json=POD), 405, "MethodNotAllowed")


def test_bad_watch_parameters(http: httpx.Client) -> None:
    assert "resourceVersion" in failure(http.get("/api/v1/pods", params={"watch": "true", "resourceVersion": "x"}),
                                        400, "BadRequest")
    assert "timeoutSeconds" in failure(http.get("/api/v1/pods", params={"watch": "1", "timeoutSeconds": "soon"}),
                                       400, "BadRequest")


def test_dry_run_is_refused_rather_than_applied(http: httpx.Client) -> None:
    response = http.post("/api/v1/namespaces/default/pods", json=POD, params={"dryRun": "All"})
    assert "dry run" in failure(response, 400, "BadRequest")
    failure(http.get("/api/v1/namespaces/default/pods/p"), 404, "NotFound")


def test_protobuf_only_clients_are_told_to_use_json(http: httpx.Client) -> None:
    response = http.get("/api/v1/nodes", headers={"Accept": "application/vnd.kubernetes.protobuf"})
    assert "application/json" in failure(response, 406, "NotAcceptable")


def test_health_and_metrics(http: httpx.Client) -> None:
    assert http.get("/healthz").text == "ok" and http.get("/readyz").status_code == 200
    http.get("/api/v1/nodes")
    metrics = http.get("/metrics").text
    assert 'localcluster_requests_total{code="200",resource="nodes",verb="list"}' in metrics
    assert 'localcluster_objects{resource="nodes"} 2.0' in metrics


def test_port_in_use_is_a_clear_error(local_cluster: LocalCluster) -> None:
    with pytest.raises(RuntimeError, match=r"Cannot listen on 127\.0\.0\.1"):
        LocalCluster(port=local_cluster.port).start()


def test_duplicate_node_names_in_the_description_are_refused() -> None:
    spec = cluster_spec(nodes=1)
    spec.nodes.append(spec.nodes[0])
    with pytest.raises(ValueError, match="node names must be unique"):
        LocalCluster(spec).start()


def test_kubeconfig_names_the_server(local_cluster: LocalCluster, tmp_path: Path) -> None:
    path = local_cluster.write_kubeconfig(tmp_path / "kube" / "config")
    config = yaml.safe_load(path.read_text())
    assert config["current-context"] == "local"
    assert config["clusters"][0]["cluster"]["server"] == local_cluster.url
