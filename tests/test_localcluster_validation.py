"""Pods and nodes are decoded and validated as by a real API server: through the kubernetes client over HTTP."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpushare.contract import RESOURCE_GPU_MEM
from gpushare.localcluster import LocalCluster

GRAMMAR = "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
LIMIT = f"spec.containers[0].resources.limits[{RESOURCE_GPU_MEM}]"


@pytest.fixture
def core(local_cluster: LocalCluster) -> client.CoreV1Api:
    return client.CoreV1Api(local_cluster.api_client())


@pytest.fixture
def http(local_cluster: LocalCluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=local_cluster.url, timeout=10) as session:
        yield session


def pod(name: str = "p", limits: dict[str, Any] | None = None, requests: dict[str, Any] | None = None,
        **container: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": "busybox", "resources": resources, **container}]}}


def rejected(call: Callable[[], Any]) -> tuple[int, dict[str, Any]]:
    with pytest.raises(ApiException) as caught:
        call()
    return caught.value.status, json.loads(caught.value.body)


def assert_invalid(status: tuple[int, dict[str, Any]], field: str, words: str) -> None:
    code, body = status
    assert (code, body["reason"]) == (422, "Invalid"), body
    assert f"{field}: " in body["message"] and words in body["message"]
    assert any(c["field"] == field and words in c["message"] for c in body["details"]["causes"]), body


# -- quantities ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["abc", "4.5.1", "1..", "2 GiB"])
def test_quantities_that_do_not_parse_are_a_bad_request(core: client.CoreV1Api, value: Any) -> None:
    code, body = rejected(lambda: core.create_namespaced_pod("default", pod(limits={RESOURCE_GPU_MEM: value})))
    assert (code, body["reason"]) == (400, "BadRequest")
    assert body["message"] == f'Pod in version "v1" cannot be handled as a Pod: {GRAMMAR}'
    assert body["details"]["causes"][0]["field"] == LIMIT


@pytest.mark.parametrize(("limits", "requests", "field", "words"), [
    ({RESOURCE_GPU_MEM: "-5"}, None, LIMIT, 'Invalid value: "-5": must be greater than or equal to 0'),
    ({RESOURCE_GPU_MEM: "1.5"}, None, LIMIT, 'Invalid value: "1500m": must be an integer'),
    ({RESOURCE_GPU_MEM: "2"}, {RESOURCE_GPU_MEM: "1"}, "spec.containers[0].resources.requests",
     f'Invalid value: "1": must be equal to {RESOURCE_GPU_MEM} limit of 2'),
    (None, {RESOURCE_GPU_MEM: "1"}, "spec.containers[0].resources.limits",
     "Required value: Limit must be set for non overcommitable resources"),
    ({"cpu": "1"}, {"cpu": "2"}, "spec.containers[0].resources.requests",
     'Invalid value: "2": must be less than or equal to cpu limit of 1'),
    ({"gpu": "1"}, None, "spec.containers[0].resources.limits[gpu]",
     'Invalid value: "gpu": must be a standard resource type or fully qualified'),
    ({"pods": "1"}, None, "spec.containers[0].resources.limits[pods]",
     'Invalid value: "pods": must be a standard resource for containers'),
    ({"example.com/a/b": "1"}, None, "spec.containers[0].resources.limits[example.com/a/b]",
     "a qualified name must consist of alphanumeric characters"),
])
def test_invalid_resources_name_the_field_and_the_rule(core: client.CoreV1Api, limits: dict[str, str] | None,
                                                       requests: dict[str, str] | None, field: str,
                                                       words: str) -> None:
    assert_invalid(rejected(lambda: core.create_namespaced_pod("default", pod(limits=limits, requests=requests))),
                   field, words)


def test_every_problem_is_reported_at_once(core: client.CoreV1Api) -> None:
    code, body = rejected(lambda: core.create_namespaced_pod(
        "default", pod(limits={RESOURCE_GPU_MEM: "-1", "cpu": "-1"}, image="")))
    assert code == 422
    fields = sorted(c["field"] for c in body["details"]["causes"])
    # The requests defaulted from the limits are validated too, as on a real server.
    assert fields == ["spec.containers[0].image", "spec.containers[0].resources.limits[aliyun.com/gpu-mem]",
                      "spec.containers[0].resources.limits[cpu]",
                      "spec.containers[0].resources.requests[aliyun.com/gpu-mem]",
                      "spec.containers[0].resources.requests[cpu]"]
    assert body["message"].startswith('Pod "p" is invalid: [')


def test_quantities_are_stored_canonical_and_requests_default_to_limits(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod("default", pod(limits={RESOURCE_GPU_MEM: "2", "cpu": "1000m",
                                                                "memory": "1.5Gi"}))
    resources = created.spec.containers[0].resources
    assert resources.limits == {RESOURCE_GPU_MEM: "2", "cpu": "1", "memory": "1536Mi"}
    assert resources.requests == resources.limits
    assert core.read_namespaced_pod("p", "default").spec.containers[0].resources.limits["cpu"] == "1"


def test_a_huge_decimal_quantity_is_accepted_as_by_a_real_server(core: client.CoreV1Api) -> None:
    # apimachinery caps only binary quantities; 1e1000000 cpu is valid and comes back in canonical form.
    created = core.create_namespaced_pod("default", pod(limits={"cpu": "1e1000000"}))
    assert created.spec.containers[0].resources.limits["cpu"] == "10e999999"


def test_updates_are_validated_too(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod())
    current = core.read_namespaced_pod("p", "default").to_dict()
    current["metadata"]["labels"] = {"bad key": "v"}
    assert_invalid(rejected(lambda: core.replace_namespaced_pod("p", "default", current)), "metadata.labels",
                   'Invalid value: "bad key": name part must consist of alphanumeric characters')


# -- structure and metadata ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "code", "words"), [
    ({"metadata": {"name": "p"}, "spec": "x"}, 400,
     "json: cannot unmarshal string into Go struct field Pod.spec of type v1.PodSpec"),
    ({"metadata": {"name": "p"}, "spec": {"containers": {}}}, 400,
     "json: cannot unmarshal object into Go struct field PodSpec.spec.containers of type []v1.Container"),
    ({"metadata": {"name": "p"}, "spec": {"containers": ["x"]}}, 400,
     "json: cannot unmarshal string into Go struct field PodSpec.spec.containers of type v1.Container"),
    ({"metadata": {"name": "p"}, "spec": {"containers": []}}, 422, "spec.containers: Required value"),
    ({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "Main", "image": "i"}]}}, 422,
     'spec.containers[0].name: Invalid value: "Main": a lowercase RFC 1123 label must consist of'),
    ({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a", "image": "i"}, {"name": "a", "image": "i"}]}},
     422, 'spec.containers[1].name: Duplicate value: "a"'),
    ({"metadata": {"name": "P_1"}, "spec": {"containers": [{"name": "a", "image": "i"}]}}, 422,
     'metadata.name: Invalid value: "P_1": a lowercase RFC 1123 subdomain must consist of'),
    ({"metadata": {"name": "p" * 254}, "spec": {"containers": [{"name": "a", "image": "i"}]}}, 422,
     "must be no more than 253 characters"),
    ({"metadata": {"name": "p", "labels": {"a": "v" * 64}}, "spec": {"containers": [{"name": "a", "image": "i"}]}},
     422, "metadata.labels: Invalid value: \"" + "v" * 64 + "\": must be no more than 63 characters"),
    ({"metadata": {"name": "p", "annotations": {"a": "x" * (256 * 1024)}},
      "spec": {"containers": [{"name": "a", "image": "i"}]}}, 422,
     "metadata.annotations: Too long: may not be more than 262144 bytes"),
])
def test_structure_and_metadata_are_checked(http: httpx.Client, body: dict[str, Any], code: int, words: str) -> None:
    response = http.post("/api/v1/namespaces/default/pods", json=body)
    assert response.status_code == code
    status = response.json()
    assert status["reason"] == ("BadRequest" if code == 400 else "Invalid")
    assert words in status["message"]


def test_node_quantities_are_validated_and_canonical(core: client.CoreV1Api) -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "extra"},
            "status": {"capacity": {"cpu": "8000m", RESOURCE_GPU_MEM: "0.5"}}}
    assert_invalid(rejected(lambda: core.create_node(node)), f"status.capacity.{RESOURCE_GPU_MEM}",
                   'Invalid value: "500m": must be an integer')
    node["status"]["capacity"][RESOURCE_GPU_MEM] = "4"
    created = core.create_node(node)
    assert created.status.capacity == {"cpu": "8", RESOURCE_GPU_MEM: "4"}
    status = core.read_node_status("extra").to_dict()
    status["status"]["allocatable"] = {"memory": "-1Gi"}
    assert_invalid(rejected(lambda: core.replace_node_status("extra", status)), "status.allocatable.memory",
                   'Invalid value: "-1Gi": must be greater than or equal to 0')
