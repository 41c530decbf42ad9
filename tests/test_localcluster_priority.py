"""The local API server's PriorityClasses, Priority admission and PodDisruptionBudgets, as a real one has them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kubernetes import client

from gpushare.localcluster import LocalCluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster() as local:
        scheduling = client.SchedulingV1Api(local.api_client())
        scheduling.create_priority_class({"metadata": {"name": "batch"}, "value": 100})
        scheduling.create_priority_class({"metadata": {"name": "waiter"}, "value": 500, "preemptionPolicy": "Never"})
        yield local


def pod(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec}}


def refusal(call: Any, *args: Any) -> tuple[int, str]:
    with pytest.raises(client.ApiException) as caught:
        call(*args)
    return caught.value.status, json.loads(caught.value.body)["message"]


def test_admission_sets_priority_and_policy_from_the_class(cluster: LocalCluster) -> None:
    core = client.CoreV1Api(cluster.api_client())
    made = core.create_namespaced_pod("default", pod("from-class", priorityClassName="batch"))
    assert (made.spec.priority, made.spec.preemption_policy) == (100, "PreemptLowerPriority")
    never = core.create_namespaced_pod("default", pod("never", priorityClassName="waiter"))
    assert (never.spec.priority, never.spec.preemption_policy) == (500, "Never")
    plain = core.create_namespaced_pod("default", pod("plain"))
    assert (plain.spec.priority, plain.spec.priority_class_name) == (0, None)
    system = core.create_namespaced_pod("default", pod("critical", priorityClassName="system-node-critical"))
    assert system.spec.priority == 2_000_001_000
    # Saying the same as the class is allowed.
    assert core.create_namespaced_pod("default", pod("same", priorityClassName="batch", priority=100)).spec.priority


@pytest.mark.parametrize(("spec", "message"), [
    ({"priorityClassName": "nope"}, 'pods "bad" is forbidden: no PriorityClass with name nope was found'),
    ({"priority": 7}, "the integer value of priority (7) must not be provided in pod spec; priority admission "
                      "controller computed 0 from the given PriorityClass name"),
    ({"priorityClassName": "batch", "preemptionPolicy": "Never"},
     "the string value of PreemptionPolicy (Never) must not be provided in pod spec"),
])
def test_admission_refuses_what_the_class_does_not_say(cluster: LocalCluster, spec: dict[str, Any],
                                                      message: str) -> None:
    core = client.CoreV1Api(cluster.api_client())
    status, text = refusal(core.create_namespaced_pod, "default", pod("bad", **spec))
    assert status == 403
    assert message in text


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"metadata": {"name": "system-mine"}, "value": 5}, 422,
     "metadata.name: Forbidden: priority class names with 'system-' prefix are reserved for system use only"),
    ({"metadata": {"name": "huge"}, "value": 1_000_000_001}, 422,
     "value: Forbidden: maximum allowed value of a user defined priority is 1000000000"),
    ({"metadata": {"name": "novalue"}}, 422, "value: Required value"),
    ({"metadata": {"name": "policy"}, "value": 1, "preemptionPolicy": "Sometimes"}, 422,
     'preemptionPolicy: Unsupported value: "Sometimes"'),
])
def test_priority_class_validation(cluster: LocalCluster, body: dict[str, Any], status: int, message: str) -> None:
    scheduling = client.SchedulingV1Api(cluster.api_client())
    code, text = refusal(scheduling.create_priority_class, body)
    assert code == status
    assert message in text


def test_a_value_that_is_not_an_int32_does_not_decode(cluster: LocalCluster) -> None:
    # The client refuses such a body itself; a raw request shows the server's own answer.
    for value in ("10", 2**31):
        answer = httpx.post(f"{cluster.url}/apis/scheduling.k8s.io/v1/priorityclasses",
                            json={"metadata": {"name": "text"}, "value": value})
        assert answer.status_code == 400
        assert "PriorityClass.value of type int32" in answer.json()["message"]


def test_one_global_default_and_an_immutable_value(cluster: LocalCluster) -> None:
    scheduling = client.SchedulingV1Api(cluster.api_client())
    scheduling.create_priority_class({"metadata": {"name": "default-one"}, "value": 10, "globalDefault": True})
    try:
        code, text = refusal(scheduling.create_priority_class,
                             {"metadata": {"name": "default-two"}, "value": 20, "globalDefault": True})
        assert (code, "PriorityClass default-one is already marked as default. Only one default can exist") == (
            403, text.split(": ", 1)[1])
        core = client.CoreV1Api(cluster.api_client())
        defaulted = core.create_namespaced_pod("default", pod("defaulted"))
        assert (defaulted.spec.priority, defaulted.spec.priority_class_name) == (10, "default-one")
        code, text = refusal(scheduling.patch_priority_class, "default-one", {"value": 11})
        assert code == 422 and "value: Forbidden: may not be changed in an update." in text
    finally:
        scheduling.delete_priority_class("default-one")


@pytest.mark.parametrize(("spec", "message"), [
    ({"minAvailable": 1, "maxUnavailable": 1}, "minAvailable and maxUnavailable cannot be both set"),
    ({"minAvailable": -1}, 'spec.minAvailable: Invalid value: "-1": must be greater than or equal to 0'),
    ({"maxUnavailable": "150%"}, 'spec.maxUnavailable: Invalid value: "150%": must not be greater than 100%'),
    ({"maxUnavailable": "half"}, "a valid percent string must be a numeric string followed by an ending '%'"),
    ({"selector": {"matchExpressions": [{"key": "app", "operator": "In"}]}},
     "spec.selector.matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or "
     "'NotIn'"),
    ({"selector": {"matchExpressions": [{"key": "app", "operator": "Near"}]}},
     'spec.selector.matchExpressions[0].operator: Invalid value: "Near": not a valid selector operator'),
])
def test_disruption_budget_validation(cluster: LocalCluster, spec: dict[str, Any], message: str) -> None:
    policy = client.PolicyV1Api(cluster.api_client())
    code, text = refusal(policy.create_namespaced_pod_disruption_budget, "default",
                         {"metadata": {"name": "bad"}, "spec": spec})
    assert code == 422
    assert message in text


def test_a_budget_starts_with_an_empty_status_that_only_the_status_subresource_changes(cluster: LocalCluster) -> None:
    policy = client.PolicyV1Api(cluster.api_client())
    made = policy.create_namespaced_pod_disruption_budget("default", {
        "metadata": {"name": "web"}, "spec": {"minAvailable": "50%", "selector": {"matchLabels": {"app": "web"}}},
        "status": {"disruptionsAllowed": 5}})
    try:
        assert made.status.disruptions_allowed == 0 and made.metadata.generation == 1
        policy.patch_namespaced_pod_disruption_budget("web", "default", {"status": {"disruptionsAllowed": 3}})
        assert policy.read_namespaced_pod_disruption_budget("web", "default").status.disruptions_allowed == 0
        policy.patch_namespaced_pod_disruption_budget_status("web", "default", {"status": {"disruptionsAllowed": 3}})
        assert policy.read_namespaced_pod_disruption_budget("web", "default").status.disruptions_allowed == 3
        code, text = refusal(policy.patch_namespaced_pod_disruption_budget_status, "web", "default",
                             {"status": {"disruptionsAllowed": -1}})
        assert code == 422 and "status.disruptionsAllowed" in text
    finally:
        policy.delete_namespaced_pod_disruption_budget("web", "default")
