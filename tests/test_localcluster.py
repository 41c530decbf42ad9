"""The local API server through the official kubernetes client: CRUD, conflicts, patches, subresources."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from conftest import cluster_spec
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpushare.contract import ANN_NODE_INVENTORY, RESOURCE_GPU_COUNT, RESOURCE_GPU_MEM, decode_inventory
from gpushare.localcluster import LocalCluster


@pytest.fixture
def core(local_cluster: LocalCluster) -> client.CoreV1Api:
    return client.CoreV1Api(local_cluster.api_client())


def pod(name: str, gpu_mem: int = 2, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"containers": [{"name": "main", "image": "busybox",
                                     "resources": {"limits": {RESOURCE_GPU_MEM: str(gpu_mem)}}}], **spec}}


def api_error(call: Callable[[], Any]) -> tuple[int, dict[str, Any]]:
    with pytest.raises(ApiException) as caught:
        call()
    return caught.value.status, json.loads(caught.value.body)


def binding(pod_name: str, node: str, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod_name, **meta},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}


# -- nodes and namespaces ----------------------------------------------------------------------------------------


def test_nodes_come_from_the_cluster_description_with_the_inventory(core: client.CoreV1Api) -> None:
    nodes = core.list_node().items
    assert [n.metadata.name for n in nodes] == ["node-0", "node-1"]
    node = nodes[0]
    assert node.metadata.labels["gpushare"] == "true"
    assert node.status.capacity[RESOURCE_GPU_MEM] == "32"  # 2 x 16160 MiB rounds to 2 x 16 GiB
    assert node.status.allocatable[RESOURCE_GPU_COUNT] == "2"
    assert node.status.capacity["cpu"] == "32"
    assert [c.type for c in node.status.conditions if c.status == "True"] == ["Ready"]
    assert any(a.type == "InternalIP" for a in node.status.addresses)
    gpus = decode_inventory(node.metadata.annotations[ANN_NODE_INVENTORY])
    assert [(g.index, g.memory_mib, g.model) for g in gpus] == [(0, 16160, "Tesla-V100-SXM2-16GB"),
                                                                  (1, 16160, "Tesla-V100-SXM2-16GB")]
    assert gpus[0].uuid and gpus[0].uuid != gpus[1].uuid


def test_nvlinks_are_published_on_both_gpus() -> None:
    spec = cluster_spec(nodes=1, gpus=2)
    spec.nodes[0].gpus[1].nvlink = [0]
    with LocalCluster(spec) as cluster:
        node = client.CoreV1Api(cluster.api_client()).read_node("node-0")
    gpus = decode_inventory(node.metadata.annotations[ANN_NODE_INVENTORY])
    assert gpus[0].links == {1: 100} and gpus[1].links == {0: 100}


def test_without_inventory_nodes_have_only_cpu_memory_and_pods() -> None:
    with LocalCluster(cluster_spec(nodes=1), publish_inventory=False) as cluster:
        node = client.CoreV1Api(cluster.api_client()).read_node("node-0")
    assert set(node.status.capacity) == {"cpu", "memory", "pods"}
    assert ANN_NODE_INVENTORY not in (node.metadata.annotations or {})


def test_node_status_subresource_takes_capacity_from_a_device_plugin(core: client.CoreV1Api) -> None:
    patched = core.patch_node_status("node-0", {"status": {"capacity": {RESOURCE_GPU_MEM: "30"}}})
    assert patched.status.capacity[RESOURCE_GPU_MEM] == "30"
    assert patched.status.capacity["cpu"] == "32"


def test_default_namespaces_exist_and_cannot_be_deleted(core: client.CoreV1Api) -> None:
    names = {n.metadata.name for n in core.list_namespace().items}
    assert {"default", "kube-system"} <= names
    assert core.read_namespace("default").status.phase == "Active"
    code, status = api_error(lambda: core.delete_namespace("default"))
    assert code == 403 and status["reason"] == "Forbidden"


def test_deleting_a_namespace_deletes_what_it_holds(core: client.CoreV1Api) -> None:
    core.create_namespace({"metadata": {"name": "team-a"}})
    core.create_namespaced_pod("team-a", pod("p"))
    core.delete_namespace("team-a")
    assert core.list_pod_for_all_namespaces().items == []
    code, status = api_error(lambda: core.create_namespaced_pod("team-a", pod("p")))
    assert code == 404 and status["message"] == 'namespaces "team-a" not found'


# -- pods ---------------------------------------------------------------------------------------------------------


def test_pod_create_get_list_delete(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod("default", pod("p1"))
    assert created.status.phase == "Pending"
    assert created.metadata.uid and created.metadata.creation_timestamp is not None
    assert created.metadata.namespace == "default"
    assert created.spec.containers[0].resources.requests == {RESOURCE_GPU_MEM: "2"}  # defaulted from limits
    assert int(created.metadata.resource_version) > 0
    assert core.read_namespaced_pod("p1", "default").metadata.uid == created.metadata.uid
    assert [p.metadata.name for p in core.list_namespaced_pod("default").items] == ["p1"]
    deleted = core.delete_namespaced_pod("p1", "default")
    assert deleted.metadata.name == "p1"
    code, status = api_error(lambda: core.read_namespaced_pod("p1", "default"))
    assert code == 404
    assert status["reason"] == "NotFound" and status["message"] == 'pods "p1" not found'
    assert status["details"] == {"name": "p1", "kind": "pods"}


def test_status_set_by_the_client_at_creation_is_reset(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod("default", {**pod("p"), "status": {"phase": "Running"}})
    assert created.status.phase == "Pending"


def test_resource_versions_grow_across_kinds(core: client.CoreV1Api) -> None:
    first = core.create_namespaced_pod("default", pod("p1"))
    config = core.create_namespaced_config_map("default", {"metadata": {"name": "c"}, "data": {"k": "v"}})
    second = core.create_namespaced_pod("default", pod("p2"))
    versions = [int(o.metadata.resource_version) for o in (first, config, second)]
    assert versions == sorted(versions) and len(set(versions)) == 3


def test_generate_name(core: client.CoreV1Api) -> None:
    body = pod("")
    body["metadata"] = {"generateName": "job-"}
    names = {core.create_namespaced_pod("default", body).metadata.name for _ in range(3)}
    assert len(names) == 3 and all(n.startswith("job-") and len(n) == 9 for n in names)


def test_already_exists(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p"))
    code, status = api_error(lambda: core.create_namespaced_pod("default", pod("p")))
    assert code == 409 and status["reason"] == "AlreadyExists"
    assert status["message"] == 'pods "p" already exists'


def test_invalid_pod_is_rejected_with_the_field(core: client.CoreV1Api) -> None:
    no_image = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "main"}]}}
    code, status = api_error(lambda: core.create_namespaced_pod("default", no_image))
    assert code == 422 and status["reason"] == "Invalid"
    assert status["message"] == 'Pod "p" is invalid: spec.containers[0].image: Required value'
    bad_name = pod("Not_A_Name")
    code, status = api_error(lambda: core.create_namespaced_pod("default", bad_name))
    assert code == 422 and "metadata.name" in status["message"]


def test_update_with_a_stale_resource_version_conflicts(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod("default", pod("p"))
    created.metadata.labels = {"v": "1"}
    updated = core.replace_namespaced_pod("p", "default", created)
    assert updated.metadata.labels == {"v": "1"}
    assert int(updated.metadata.resource_version) > int(created.metadata.resource_version)
    created.metadata.labels = {"v": "2"}  # still carries the old resourceVersion
    code, status = api_error(lambda: core.replace_namespaced_pod("p", "default", created))
    assert code == 409 and status["reason"] == "Conflict"
    assert status["message"] == ('Operation cannot be fulfilled on pods "p": the object has been modified; please '
                                 "apply your changes to the latest version and try again")
    assert core.read_namespaced_pod("p", "default").metadata.labels == {"v": "1"}


def test_update_without_a_resource_version_always_applies(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod("default", pod("p"))
    created.metadata.resource_version = None
    created.metadata.annotations = {"a": "b"}
    assert core.replace_namespaced_pod("p", "default", created).metadata.annotations == {"a": "b"}


def test_an_unchanged_update_keeps_the_resource_version(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod("default", pod("p"))
    again = core.replace_namespaced_pod("p", "default", created)
    assert again.metadata.resource_version == created.metadata.resource_version


def test_patch_with_a_stale_resource_version_conflicts(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod("default", pod("p"))
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"a": "1"}}})
    stale = {"metadata": {"resourceVersion": created.metadata.resource_version, "labels": {"a": "2"}}}
    code, status = api_error(lambda: core.patch_namespaced_pod("p", "default", stale))
    assert code == 409 and status["reason"] == "Conflict"
    current = core.read_namespaced_pod("p", "default")
    fresh = {"metadata": {"resourceVersion": current.metadata.resource_version, "labels": {"a": "3"}}}
    assert core.patch_namespaced_pod("p", "default", fresh).metadata.labels == {"a": "3"}


def test_merge_patch_replaces_lists_and_deletes_keys_with_null(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p", labels={"keep": "1", "drop": "1"}))
    patched = core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"drop": None, "new": "1"}}},
                                        _content_type="application/merge-patch+json")
    assert patched.metadata.labels == {"keep": "1", "new": "1"}
    # A merge patch replaces the container list whole, which would change the (immutable) resources.
    body = {"spec": {"containers": [{"name": "main", "image": "busybox:2"}]}}
    code, status = api_error(lambda: core.patch_namespaced_pod("p", "default", body,
                                                               _content_type="application/merge-patch+json"))
    assert code == 422 and "Forbidden" in status["message"]


def test_strategic_merge_patch_merges_containers_by_name(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p"))
    body = {"spec": {"containers": [{"name": "main", "image": "busybox:2"}]}}
    patched = core.patch_namespaced_pod("p", "default", body,
                                        _content_type="application/strategic-merge-patch+json")
    container = patched.spec.containers[0]
    assert (container.image, container.resources.limits) == ("busybox:2", {RESOURCE_GPU_MEM: "2"})


def test_strategic_merge_patch_merges_node_conditions_by_type(core: client.CoreV1Api) -> None:
    condition = {"type": "MemoryPressure", "status": "False"}
    patched = core.patch_node_status("node-0", {"status": {"conditions": [condition]}})
    assert sorted(c.type for c in patched.status.conditions) == ["MemoryPressure", "Ready"]


def test_json_patch(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p"))
    operations = [{"op": "add", "path": "/metadata/annotations", "value": {"x/y": "1"}},
                  {"op": "replace", "path": "/metadata/annotations/x~1y", "value": "2"}]
    assert core.patch_namespaced_pod("p", "default", operations).metadata.annotations == {"x/y": "2"}
    failing = [{"op": "test", "path": "/metadata/annotations/x~1y", "value": "1"}]
    code, status = api_error(lambda: core.patch_namespaced_pod("p", "default", failing))
    assert code == 422 and "does not apply" in status["message"]


def test_patch_of_a_missing_object_is_not_found(core: client.CoreV1Api) -> None:
    code, status = api_error(lambda: core.patch_namespaced_pod("ghost", "default", {"metadata": {"labels": {}}}))
    assert code == 404 and status["reason"] == "NotFound"


def test_status_subresource_changes_only_status(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod("default", pod("p"))
    body = core.api_client.sanitize_for_serialization(created)
    body["status"]["phase"] = "Running"
    body["spec"]["nodeName"] = "node-1"  # ignored through /status
    updated = core.replace_namespaced_pod_status("p", "default", body)
    assert (updated.status.phase, updated.spec.node_name) == ("Running", None)
    # ... and the main resource ignores status.
    updated.status.phase = "Failed"
    updated.metadata.labels = {"seen": "yes"}
    again = core.replace_namespaced_pod("p", "default", updated)
    assert (again.status.phase, again.metadata.labels) == ("Running", {"seen": "yes"})


def test_pod_spec_is_immutable_through_update(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod("default", pod("p"))
    created.spec.node_name = "node-0"
    code, status = api_error(lambda: core.replace_namespaced_pod("p", "default", created))
    assert code == 422 and "create a Binding" in status["message"]


def test_delete_with_a_stale_uid_precondition_conflicts(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p"))
    options = {"preconditions": {"uid": "not-the-uid"}}
    code, status = api_error(lambda: core.delete_namespaced_pod("p", "default", body=options))
    assert code == 409 and "Precondition failed" in status["message"]
    assert core.read_namespaced_pod("p", "default")


def test_delete_collection_by_label(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("a", labels={"app": "x"}))
    core.create_namespaced_pod("default", pod("b", labels={"app": "y"}))
    core.delete_collection_namespaced_pod("default", label_selector="app=x")
    assert [p.metadata.name for p in core.list_namespaced_pod("default").items] == ["b"]


def test_list_across_namespaces(core: client.CoreV1Api) -> None:
    core.create_namespace({"metadata": {"name": "other"}})
    core.create_namespaced_pod("default", pod("a"))
    core.create_namespaced_pod("other", pod("b"))
    everywhere = core.list_pod_for_all_namespaces().items
    assert [(p.metadata.namespace, p.metadata.name) for p in everywhere] == [("default", "a"), ("other", "b")]
    assert [p.metadata.name for p in core.list_namespaced_pod("other").items] == ["b"]


# -- binding ------------------------------------------------------------------------------------------------------


def test_binding_through_the_pod_subresource(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p"))
    response = core.create_namespaced_pod_binding("p", "default", binding("p", "node-1"), _preload_content=False)
    assert response.status == 201
    assert json.loads(response.data)["status"] == "Success"
    bound = core.read_namespaced_pod("p", "default")
    assert bound.spec.node_name == "node-1"
    assert [(c.type, c.status) for c in bound.status.conditions] == [("PodScheduled", "True")]


def test_binding_through_the_namespace_collection_copies_annotations(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p"))
    body = binding("p", "node-0", annotations={"ALIYUN_COM_GPU_MEM_IDX": "1"})
    core.create_namespaced_binding("default", body, _preload_content=False)
    bound = core.read_namespaced_pod("p", "default")
    assert bound.spec.node_name == "node-0"
    assert bound.metadata.annotations == {"ALIYUN_COM_GPU_MEM_IDX": "1"}


def test_binding_twice_conflicts(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p"))
    core.create_namespaced_pod_binding("p", "default", binding("p", "node-0"), _preload_content=False)
    code, status = api_error(lambda: core.create_namespaced_binding("default", binding("p", "node-1"),
                                                                    _preload_content=False))
    assert code == 409 and status["reason"] == "Conflict"
    assert status["message"] == ('Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to '
                                 'node "node-0"')
    assert core.read_namespaced_pod("p", "default").spec.node_name == "node-0"


def test_binding_a_missing_pod_or_without_a_node_fails(core: client.CoreV1Api) -> None:
    code, _ = api_error(lambda: core.create_namespaced_binding("default", binding("ghost", "node-0"),
                                                               _preload_content=False))
    assert code == 404
    core.create_namespaced_pod("default", pod("p"))
    body = {"metadata": {"name": "p"}, "target": {"kind": "Node", "name": ""}}
    code, status = api_error(lambda: core.create_namespaced_binding("default", body, _preload_content=False))
    assert code == 422 and "target.name" in status["message"]


def test_binding_with_another_pods_uid_conflicts(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("p"))
    body = binding("p", "node-0", uid="0000")
    code, status = api_error(lambda: core.create_namespaced_binding("default", body, _preload_content=False))
    assert code == 409 and "UID" in status["message"]


def test_binding_checks_its_resource_version_before_the_node(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod("default", pod("p"))
    core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"changed": "yes"}}})
    stale = binding("p", "node-0", uid=created.metadata.uid, resourceVersion=created.metadata.resource_version,
                    annotations={"ALIYUN_COM_GPU_MEM_IDX": "1"})
    code, status = api_error(lambda: core.create_namespaced_binding("default", stale, _preload_content=False))
    assert code == 409 and status["details"]["kind"] == "pods"
    assert "Precondition failed: ResourceVersion in precondition: " in status["message"]
    unchanged = core.read_namespaced_pod("p", "default")
    assert not unchanged.spec.node_name and not unchanged.metadata.annotations
    # A precondition is checked before the pod's node: a stale Binding of a bound pod says it is stale.
    current = binding("p", "node-0", resourceVersion=unchanged.metadata.resource_version)
    core.create_namespaced_binding("default", current, _preload_content=False)
    code, status = api_error(lambda: core.create_namespaced_binding("default", current, _preload_content=False))
    assert code == 409 and "Precondition failed" in status["message"]


# -- other kinds --------------------------------------------------------------------------------------------------


def test_configmap_crud(core: client.CoreV1Api) -> None:
    core.create_namespaced_config_map("kube-system", {"metadata": {"name": "cfg"}, "data": {"policy": "binpack"}})
    read = core.read_namespaced_config_map("cfg", "kube-system")
    read.data["policy"] = "spread"
    assert core.replace_namespaced_config_map("cfg", "kube-system", read).data == {"policy": "spread"}
    status = core.delete_namespaced_config_map("cfg", "kube-system")
    assert status["status"] == "Success"
    assert core.list_namespaced_config_map("kube-system").items == []


def test_event_crud(core: client.CoreV1Api) -> None:
    event = {"metadata": {"name": "p.1"}, "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
             "reason": "FailedScheduling", "message": "no GPU has 20 GiB free", "type": "Warning"}
    core.create_namespaced_event("default", event)
    found = core.list_namespaced_event("default", field_selector="involvedObject.name=p,reason=FailedScheduling")
    assert [e.message for e in found.items] == ["no GPU has 20 GiB free"]
    core.patch_namespaced_event("p.1", "default", {"count": 2})
    assert core.read_namespaced_event("p.1", "default").count == 2
    core.delete_namespaced_event("p.1", "default")
    assert core.list_event_for_all_namespaces().items == []


def test_lease_crud(local_cluster: LocalCluster) -> None:
    leases = client.CoordinationV1Api(local_cluster.api_client())
    body = {"metadata": {"name": "gpushare-extender"},
            "spec": {"holderIdentity": "replica-a", "leaseDurationSeconds": 15,
                     "renewTime": "2026-01-01T00:00:00.000000Z"}}
    created = leases.create_namespaced_lease("kube-system", body)
    assert created.spec.holder_identity == "replica-a"
    stale = leases.api_client.sanitize_for_serialization(created)
    created.spec.holder_identity = "replica-b"
    assert leases.replace_namespaced_lease("gpushare-extender", "kube-system", created).spec.holder_identity == (
        "replica-b")
    stale["spec"]["holderIdentity"] = "replica-c"
    code, status = api_error(lambda: leases.replace_namespaced_lease("gpushare-extender", "kube-system", stale))
    assert code == 409 and status["details"] == {"name": "gpushare-extender", "group": "coordination.k8s.io",
                                                 "kind": "leases"}
    assert [le.metadata.name for le in leases.list_lease_for_all_namespaces().items] == ["gpushare-extender"]
    leases.delete_namespaced_lease("gpushare-extender", "kube-system")
    code, status = api_error(lambda: leases.read_namespaced_lease("gpushare-extender", "kube-system"))
    assert code == 404 and status["message"] == 'leases.coordination.k8s.io "gpushare-extender" not found'
