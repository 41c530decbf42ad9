"""The extender over real HTTP against the local API server: kube-scheduler's verbs, inspect, bad input."""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import orjson
import pytest
from conftest import gc_collections
from kubernetes import client
from test_extender_harness import (
    T4,
    T4_MIB,
    V100_32,
    V100_32_MIB,
    create_pod,
    emptied_core,
    gpu_node,
    pod_body,
    read_pod,
    running_extender,
    spec,
    wait_for,
)

from extender.collector import BACKSTOP, FULL_COLLECTION_AFTER, MIDDLE, YOUNG
from extender.config import ExtenderConfig, NodeChoice
from extender.verbs import FILTER_HOLD_S
from gpushare.contract import (
    ANN_ASSIGNED,
    ANN_CONTAINER_SHARES,
    ANN_DEV,
    ANN_GPU_INDICES,
    ANN_IDX,
    ANN_MEMORY_UNIT,
    ANN_POD,
    MemoryUnit,
)
from gpushare.kube.api import DEFAULT_TIMEOUT_S, MERGE_PATCH, Pods
from gpushare.localcluster import LocalCluster

FILTER_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


class Env:
    def __init__(self, cluster: LocalCluster, url: str) -> None:
        self.cluster = cluster
        self.url = url
        self.core = client.CoreV1Api(cluster.api_client())
        self.http = httpx.Client(base_url=url, timeout=10)

    def post(self, verb: str, payload: Any) -> httpx.Response:
        return self.http.post(f"/gpushare-scheduler/{verb}", content=orjson.dumps(payload))

    def nodes(self, *names: str) -> list[dict[str, Any]]:
        listed: Any = self.core.list_node(_preload_content=False)
        items: list[dict[str, Any]] = orjson.loads(listed.data)["items"]
        return [n for n in items if n["metadata"]["name"] in names]

    def filter(self, pod: dict[str, Any], node: str) -> None:
        self.post("filter", {"Pod": pod, "NodeNames": [node]})

    def bind(self, pod: dict[str, Any], node: str, filter_first: bool = True) -> str:
        """Bind the pod to ``node``, after filtering it there as kube-scheduler does; the bind's Error."""
        if filter_first:
            self.filter(pod, node)
        response = self.post("bind", {"PodName": pod["metadata"]["name"], "PodNamespace": "default",
                                      "PodUID": pod["metadata"]["uid"], "Node": node})
        assert response.status_code == 200
        body = response.json()
        assert set(body) == {"Error"}
        return str(body["Error"])

    def inspect(self, node: str | None = None) -> Any:
        path = "/gpushare-scheduler/inspect" + (f"/{node}" if node else "")
        return self.http.get(path).json()

    def metric(self, name: str) -> float:
        for line in self.http.get("/metrics").text.splitlines():
            if line.startswith(name + " ") or (line.startswith(name + "{") and "{" not in name):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"metric {name} not exported")

    def settled(self) -> None:
        wait_for(lambda: self.metric("gpushare_extender_reservations") == 0, "the watch to confirm every bind")


CLUSTER = spec(gpu_node("mixed", (T4, T4_MIB), (V100_32, V100_32_MIB)),
               gpu_node("t4x2", (T4, T4_MIB), (T4, T4_MIB)),
               gpu_node("cpu-only"))


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(CLUSTER) as local:
        yield local


@pytest.fixture
def env(cluster: LocalCluster) -> Iterator[Env]:
    core = client.CoreV1Api(cluster.api_client())
    core.delete_collection_namespaced_pod("default", grace_period_seconds=0)
    with running_extender(cluster) as url:
        yield Env(cluster, url)


def test_filter_by_node_names(env: Env) -> None:
    names = ["mixed", "t4x2", "cpu-only", "ghost"]
    pod = create_pod(env.core, pod_body("p", 20))
    response = env.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == FILTER_KEYS
    assert body["NodeNames"] == ["mixed"]
    assert body["Nodes"] is None
    assert body["Error"] == ""
    # The pod has its node: kube-scheduler reads no reason, so none is worded.
    assert body["FailedNodes"] == {} and body["FailedAndUnresolvableNodes"] == {}

    nowhere = create_pod(env.core, pod_body("nowhere", 40, gpu_count=2))  # 20 units on each of two GPUs
    body = env.post("filter", {"Pod": nowhere, "Nodes": None, "NodeNames": names}).json()
    assert body["NodeNames"] == [] and body["Error"] == ""
    assert "have 1 GPU(s) of 20 GiB or more, the pod needs 2" in body["FailedAndUnresolvableNodes"]["mixed"]
    assert "largest GPU has 15 GiB" in body["FailedAndUnresolvableNodes"]["t4x2"]
    assert "no GPUs that gpushare manages" in body["FailedAndUnresolvableNodes"]["cpu-only"]
    assert "not in the gpushare extender's cache" in body["FailedNodes"]["ghost"]


@pytest.mark.parametrize("choice", list(NodeChoice))
def test_filter_with_full_node_objects(cluster: LocalCluster, choice: NodeChoice) -> None:
    core = emptied_core(cluster)
    with running_extender(cluster, ExtenderConfig(node_choice=choice)) as url:
        env = Env(cluster, url)
        pod = create_pod(core, pod_body("p", 10))
        items = env.nodes("mixed", "t4x2", "cpu-only")
        node_list = {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"}, "items": items}
        body = env.post("filter", {"Pod": pod, "Nodes": node_list, "NodeNames": None}).json()
        assert set(body) == FILTER_KEYS
        assert body["NodeNames"] is None
        passed = [n["metadata"]["name"] for n in body["Nodes"]["items"]]
        # 'mixed' leaves its 32 GiB V100 whole for larger pods: the policy's favourite
        assert passed == (["mixed"] if choice is NodeChoice.FILTER else ["mixed", "t4x2"])
        assert body["Nodes"]["items"] == [n for n in items if n["metadata"]["name"] in passed]
        assert body["Nodes"]["kind"] == "NodeList"
        # Choosing in filter, the pod has its node and no reason is worded; otherwise every node is accounted for.
        unresolvable = [] if choice is NodeChoice.FILTER else ["cpu-only"]
        assert list(body["FailedAndUnresolvableNodes"]) == unresolvable and body["FailedNodes"] == {}


def test_pod_without_gpu_passes_every_node(env: Env) -> None:
    pod = create_pod(env.core, pod_body("plain"))
    body = env.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": ["cpu-only", "ghost"]}).json()
    assert body["NodeNames"] == ["cpu-only", "ghost"]
    assert body["FailedNodes"] == {} and body["FailedAndUnresolvableNodes"] == {}


def test_malformed_pod_request_is_an_error_sentence(env: Env) -> None:
    pod = create_pod(env.core, pod_body("odd", 3, gpu_count=2))
    body = env.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": ["mixed"]}).json()
    assert set(body) == FILTER_KEYS
    assert "does not divide evenly" in body["Error"]
    assert body["NodeNames"] is None


def test_prioritize_in_both_modes(env: Env) -> None:
    busy = create_pod(env.core, pod_body("busy", 10))
    assert env.bind(busy, "t4x2") == ""
    pod = create_pod(env.core, pod_body("p", 4))
    by_name = env.post("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": ["mixed", "t4x2"]})
    assert by_name.status_code == 200
    scores = by_name.json()
    assert all(set(entry) == {"Host", "Score"} for entry in scores)
    # binpack: t4x2 has a GPU with 5 units free, the tightest fit for 4
    assert {e["Host"]: e["Score"] for e in scores}["t4x2"] == 10
    assert {e["Host"]: e["Score"] for e in scores}["mixed"] < 10
    node_list = {"items": env.nodes("mixed", "t4x2")}
    assert env.post("prioritize", {"Pod": pod, "Nodes": node_list, "NodeNames": None}).json() == scores


def test_prioritize_uses_the_pods_policy(env: Env) -> None:
    busy = create_pod(env.core, pod_body("busy", 10))
    assert env.bind(busy, "t4x2") == ""
    pod = create_pod(env.core, pod_body("p", 4, annotations={"gpushare.io/scheduler-policy": "spread"}))
    scores = env.post("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": ["mixed", "t4x2"]}).json()
    assert {e["Host"]: e["Score"] for e in scores} == {"mixed": 10, "t4x2": 0}


def test_bind_writes_annotations_with_the_binding(env: Env) -> None:
    pod = create_pod(env.core, pod_body("p", 10))
    assert env.bind(pod, "mixed") == ""
    stored = read_pod(env.core, "p")
    assert stored["spec"]["nodeName"] == "mixed"
    ann = stored["metadata"]["annotations"]
    # Filter taught the default (learning) policy this pod's shape first; knowing it, the policy takes GPU 1.
    assert (ann[ANN_IDX], ann[ANN_POD], ann[ANN_DEV], ann[ANN_ASSIGNED]) == ("1", "10", "32", "false")
    env.settled()
    assert env.inspect("mixed")["nodes"][0]["devs"][1]["pods"] == [{"name": "p", "namespace": "default",
                                                                     "usedGPU": 10}]
    assert env.metric("gpushare_extender_binds_total") == 1


def api_requests(env: Env) -> dict[tuple[str, str], float]:
    """The local API server's request counts by (verb, resource)."""
    counts: dict[tuple[str, str], float] = {}
    for line in httpx.get(env.cluster.url + "/metrics").text.splitlines():
        if line.startswith("localcluster_requests_total{"):
            labels = dict(part.split("=", 1) for part in line[line.index("{") + 1:line.index("}")].split(","))
            key = (labels["verb"].strip('"'), labels["resource"].strip('"'))
            counts[key] = counts.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


def test_bind_takes_the_pod_from_its_watch_and_makes_one_api_call(env: Env) -> None:
    pod = create_pod(env.core, pod_body("watched", 2))
    wait_for(lambda: env.post("filter", {"Pod": pod, "NodeNames": ["mixed"]}).json()["NodeNames"] == ["mixed"],
             "the extender's watch to see the pod")
    before = api_requests(env)
    assert env.bind(pod, "mixed") == ""
    after = api_requests(env)
    made = {k: after.get(k, 0) - before.get(k, 0) for k in after
            if after.get(k, 0) != before.get(k, 0) and k[1]}  # k[1] "": this test's own scrape of /metrics
    # One Binding carrying the annotations, as kube-scheduler's own bind costs: no GET of the pod, no patch,
    # no Event for a bind that worked.
    assert made == {("bind", "pods"): 1}, made
    assert read_pod(env.core, "watched")["metadata"]["annotations"][ANN_POD] == "2"


def test_metrics_time_each_pod_from_its_first_filter_to_its_bind(env: Env) -> None:
    pod = create_pod(env.core, pod_body("waited", 2))
    for _ in range(2):  # kube-scheduler filters again on a retry; the wait counts from the first
        env.post("filter", {"Pod": pod, "NodeNames": ["mixed"]})
    time.sleep(0.3)
    assert env.bind(pod, "mixed") == ""
    assert env.metric("gpushare_extender_pod_scheduling_wait_seconds_count") == 1
    assert env.metric("gpushare_extender_pod_scheduling_wait_seconds_sum") >= 0.3
    text = env.http.get("/metrics").text
    for verb in ("filter", "bind"):
        assert f'gpushare_extender_request_duration_seconds_count{{verb="{verb}"}}' in text


def test_mixed_models_get_their_own_memory(env: Env) -> None:
    pod = create_pod(env.core, pod_body("big", 20))
    assert env.bind(pod, "mixed") == ""
    ann = read_pod(env.core, "big")["metadata"]["annotations"]
    assert (ann[ANN_IDX], ann[ANN_DEV]) == ("1", "32")
    view = env.inspect("mixed")
    assert [(d["id"], d["totalGPU"], d["usedGPU"]) for d in view["nodes"][0]["devs"]] == [(0, 15, 0), (1, 32, 20)]
    assert view["error"] == ""


def test_multi_container_pod_is_accounted_as_one(env: Env) -> None:
    pod = create_pod(env.core, pod_body("two", [3, 5]))
    assert env.bind(pod, "t4x2") == ""
    ann = read_pod(env.core, "two")["metadata"]["annotations"]
    assert ann[ANN_POD] == "8"
    assert json.loads(ann[ANN_CONTAINER_SHARES]) == {"c0": 3, "c1": 5}
    env.settled()
    assert env.inspect("t4x2")["nodes"][0]["usedGPU"] == 8


def test_multi_gpu_pod_spans_gpus(env: Env) -> None:
    pod = create_pod(env.core, pod_body("wide", 24, gpu_count=2))
    body = env.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": ["mixed", "t4x2"]}).json()
    # Both fit; filter passes the one the policy chooses (the T4 pair, keeping the V100 for larger pods).
    assert body["NodeNames"] == ["t4x2"] and body["FailedNodes"] == body["FailedAndUnresolvableNodes"] == {}
    assert env.bind(pod, "t4x2") == ""
    ann = read_pod(env.core, "wide")["metadata"]["annotations"]
    assert (ann[ANN_GPU_INDICES], ann[ANN_POD], ann[ANN_MEMORY_UNIT]) == ("0,1", "24", "GiB")
    env.settled()
    assert [d["usedGPU"] for d in env.inspect("t4x2")["nodes"][0]["devs"]] == [12, 12]
    again = create_pod(env.core, pod_body("wide2", 8, gpu_count=2))
    body = env.post("filter", {"Pod": again, "Nodes": None, "NodeNames": ["t4x2"]}).json()
    assert body["FailedNodes"]["t4x2"] == "node(s) have 0 GPU(s) with 4 GiB free, the pod needs 2"


def test_impossible_request_is_unresolvable(env: Env) -> None:
    pod = create_pod(env.core, pod_body("huge", 64))
    body = env.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": ["mixed", "t4x2"]}).json()
    assert body["NodeNames"] == []
    assert body["FailedAndUnresolvableNodes"]["mixed"] == (
        "node(s) have 0 GPU(s) of 64 GiB or more, the pod needs 1 (their largest GPU has 32 GiB)")
    assert set(body["FailedAndUnresolvableNodes"]) == {"mixed", "t4x2"}


def test_filter_holds_its_choice_for_the_bind_kube_scheduler_sends_after_the_next_pods_filter(env: Env) -> None:
    """kube-scheduler binds in the background and filters the next pod meanwhile: the node the first pod's filter
    chose must not be offered to the second before the first's bind arrives, and both binds then succeed."""
    # Two GPUs of 12 GiB each: either node takes one such pod, and not a second.
    first = create_pod(env.core, pod_body("first", 24, gpu_count=2))
    second = create_pod(env.core, pod_body("second", 24, gpu_count=2))
    names = ["mixed", "t4x2"]
    answers = [env.post("filter", {"Pod": pod, "NodeNames": names}).json()["NodeNames"] for pod in (first, second)]
    assert answers[0] != answers[1] and all(len(answer) == 1 for answer in answers), answers
    for pod, [node] in zip((first, second), answers, strict=True):
        assert env.bind(pod, node, filter_first=False) == ""
    env.settled()


def test_a_hold_that_no_bind_takes_over_is_given_back_and_counted(env: Env) -> None:
    """kube-scheduler may give a pod up after its filter (a Reserve or Permit step failed, the scheduler restarted):
    the GPUs filter held for it go back after ``FILTER_HOLD_S``, and /metrics counts them."""
    first = create_pod(env.core, pod_body("first", 24, gpu_count=2))
    second = create_pod(env.core, pod_body("second", 24, gpu_count=2))
    assert env.post("filter", {"Pod": first, "NodeNames": ["t4x2"]}).json()["NodeNames"] == ["t4x2"]
    assert env.post("filter", {"Pod": second, "NodeNames": ["t4x2"]}).json()["NodeNames"] == []
    lapsed = "gpushare_extender_filter_holds_lapsed_total"
    wait_for(lambda: env.metric(lapsed) == 1, "the hold to lapse", timeout_s=FILTER_HOLD_S + 5)
    assert env.post("filter", {"Pod": second, "NodeNames": ["t4x2"]}).json()["NodeNames"] == ["t4x2"]
    assert env.bind(second, "t4x2", filter_first=False) == ""


def test_bind_that_no_longer_fits_fails_cleanly(env: Env) -> None:
    second = create_pod(env.core, pod_body("second", 30))
    env.filter(second, "mixed")
    # A pod placed by another scheduler (or a peer replica's bind) takes the GPU the filter held before the bind.
    rival = pod_body("first", 30, node="mixed", annotations={ANN_IDX: "1", ANN_POD: "30", ANN_DEV: "32"})
    create_pod(env.core, rival)
    wait_for(lambda: env.inspect("mixed")["nodes"][0]["devs"][1]["usedGPU"] > 32, "the watch to show the rival pod")
    error = env.bind(second, "mixed", filter_first=False)
    assert "gpushare could not bind pod default/second to node mixed: the pod no longer fits" in error
    stored = read_pod(env.core, "second")
    assert ANN_IDX not in (stored["metadata"].get("annotations") or {})
    assert not stored["spec"].get("nodeName")
    events: Any = env.core.list_namespaced_event("default", _preload_content=False)
    reasons = [(e["reason"], e["involvedObject"]["name"]) for e in orjson.loads(events.data)["items"]]
    assert ("GPUShareBindFailed", "second") in reasons


def test_bind_of_a_recreated_pod_is_refused(env: Env) -> None:
    pod = create_pod(env.core, pod_body("p", 2))
    stale = {**pod, "metadata": {**pod["metadata"], "uid": "not-the-uid"}}
    assert "deleted and recreated" in env.bind(stale, "mixed")


def test_bind_is_idempotent_once_bound(env: Env) -> None:
    pod = create_pod(env.core, pod_body("p", 2))
    assert env.bind(pod, "mixed") == ""
    assert env.bind(pod, "mixed") == ""
    assert "already bound to node mixed" in env.bind(pod, "t4x2")
    env.settled()
    assert env.inspect("mixed")["nodes"][0]["usedGPU"] == 2


def test_bind_of_a_pod_without_gpu(env: Env) -> None:
    pod = create_pod(env.core, pod_body("plain"))
    assert env.bind(pod, "cpu-only") == ""
    stored = read_pod(env.core, "plain")
    assert stored["spec"]["nodeName"] == "cpu-only"
    assert ANN_IDX not in (stored["metadata"].get("annotations") or {})


class MeddlingPods(Pods):
    """The extender's pod calls, except that another client changes the pod just before the first Binding."""

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__(cluster.api_client())
        self._other = client.CoreV1Api(cluster.api_client())
        self.meddled = False

    def bind(self, namespace: str, name: str, uid: str, node: str, *, annotations: Mapping[str, str] | None = None,
             resource_version: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if not self.meddled:
            self.meddled = True
            self._other.patch_namespaced_pod(name, namespace, {"metadata": {"labels": {"meddled": "yes"}}},
                                             _content_type=MERGE_PATCH)
        super().bind(namespace, name, uid, node, annotations=annotations, resource_version=resource_version,
                     timeout_s=timeout_s)


def test_conflicting_change_between_read_and_binding_is_retried(cluster: LocalCluster) -> None:
    core = client.CoreV1Api(cluster.api_client())
    core.delete_collection_namespaced_pod("default", grace_period_seconds=0)
    pods = MeddlingPods(cluster)
    with running_extender(cluster, pods=pods) as url:
        env = Env(cluster, url)
        pod = create_pod(core, pod_body("p", 6))
        assert env.bind(pod, "mixed") == ""
        stored = read_pod(core, "p")
        assert stored["metadata"]["labels"] == {"meddled": "yes"}
        assert stored["metadata"]["annotations"][ANN_IDX] == "0"
        assert stored["spec"]["nodeName"] == "mixed"
        assert env.metric("gpushare_extender_bind_conflicts_total") == 1
        env.settled()
        assert env.inspect("mixed")["nodes"][0]["usedGPU"] == 6


class RivalBinderPods(Pods):
    """The extender's pod calls, except that another scheduler binds the pod to t4x2 just before our Binding."""

    def bind(self, namespace: str, name: str, uid: str, node: str, *, annotations: Mapping[str, str] | None = None,
             resource_version: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        super().bind(namespace, name, uid, "t4x2")
        super().bind(namespace, name, uid, node, annotations=annotations, resource_version=resource_version,
                     timeout_s=timeout_s)


def test_a_binding_refused_writes_nothing_and_releases_the_reservation(cluster: LocalCluster) -> None:
    core = client.CoreV1Api(cluster.api_client())
    core.delete_collection_namespaced_pod("default", grace_period_seconds=0)
    with running_extender(cluster, pods=RivalBinderPods(cluster.api_client())) as url:
        env = Env(cluster, url)
        pod = create_pod(core, pod_body("p", 12))
        error = env.bind(pod, "mixed")
        # The Binding conflicts; the pod read again is someone else's now.
        assert error == "gpushare could not bind pod default/p to node mixed: the pod is already bound to node t4x2"
        stored = read_pod(core, "p")
        assert stored["spec"]["nodeName"] == "t4x2"
        assert ANN_IDX not in (stored["metadata"].get("annotations") or {})
        assert env.metric("gpushare_extender_reservations") == 0
        assert env.metric("gpushare_extender_bind_conflicts_total") == 1
        assert env.inspect("mixed")["nodes"][0]["usedGPU"] == 0
        assert env.metric('gpushare_extender_binds_total{result="failed"}') == 1


@pytest.mark.parametrize("verb", ["filter", "prioritize", "bind"])
def test_malformed_json_is_400_with_a_sentence(env: Env, verb: str) -> None:
    response = env.http.post(f"/gpushare-scheduler/{verb}", content=b"{not json")
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["Error"]


SOME_POD = {"metadata": {"name": "p"}, "spec": {"containers": []}}


@pytest.mark.parametrize(("payload", "message"), [
    ([], "must be a JSON object"),
    ({"Pod": None, "NodeNames": []}, "ExtenderArgs.Pod must be an object, not null."),
    ({"Pod": SOME_POD, "NodeNames": "mixed"}, "NodeNames must be a list of node names"),
    ({"Pod": SOME_POD, "NodeNames": [1, 2]}, "NodeNames must be a list of node names"),
    ({"Pod": SOME_POD, "Nodes": {"items": [{}]}}, "items each have metadata.name"),
    ({"Pod": SOME_POD}, "neither NodeNames"),
])
def test_wrong_shapes_are_400(env: Env, payload: Any, message: str) -> None:
    for verb in ("filter", "prioritize"):
        response = env.post(verb, payload)
        assert response.status_code == 400
        assert message in response.json()["Error"]


@pytest.mark.parametrize("verb", ["filter", "prioritize", "preempt", "bind"])
def test_verbs_answer_only_post(env: Env, verb: str) -> None:
    response = env.http.get(f"/gpushare-scheduler/{verb}")
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    assert response.json() == {"detail": "Method Not Allowed"}
    assert env.http.post(f"/gpushare-scheduler/{verb}/more", content=b"{}").status_code == 404


def test_bind_with_missing_fields_is_400(env: Env) -> None:
    response = env.post("bind", {"PodName": "p", "PodNamespace": "default"})
    assert response.status_code == 400
    assert "ExtenderBindingArgs.PodUID must be" in response.json()["Error"]


def test_inspect_unknown_node_is_404(env: Env) -> None:
    response = env.http.get("/gpushare-scheduler/inspect/nowhere")
    assert response.status_code == 404
    assert response.json() == {"nodes": [], "error": "Node 'nowhere' is not in the gpushare extender's cache; "
                                                     "check the name with 'kubectl get nodes'."}


def test_inspect_lists_every_gpu_node(env: Env) -> None:
    view = env.inspect()
    assert view["error"] == ""
    names = [n["name"] for n in view["nodes"]]
    assert names == ["cpu-only", "mixed", "t4x2"]
    mixed = view["nodes"][1]
    assert set(mixed) == {"name", "totalGPU", "usedGPU", "devs"}
    assert set(mixed["devs"][0]) == {"id", "totalGPU", "usedGPU", "pods"}


def test_service_routes(env: Env) -> None:
    assert env.http.get("/version").json() == {"version": "0.1.0"}
    assert env.http.get("/healthz").status_code == 200
    assert env.http.get("/readyz").status_code == 200
    pod = create_pod(env.core, pod_body("p", 1))
    env.post("filter", {"Pod": pod, "NodeNames": ["mixed"]})
    text = env.http.get("/metrics").text
    assert 'gpushare_extender_requests_total{code="200",verb="filter"} 1.0' in text
    assert 'gpushare_extender_request_duration_seconds_count{verb="filter"} 1.0' in text
    assert 'gpushare_extender_nodes 3.0' in text


def test_metrics_count_gpus_and_memory_per_model(env: Env) -> None:
    """Per model, never per GPU: per-GPU series are the device plugins' (thousands of nodes would make the
    extender's scrape a stall of every filter)."""
    assert env.metric('gpushare_cluster_gpus{model="Tesla-T4"}') == 3
    assert env.metric('gpushare_cluster_gpu_memory_mib{model="Tesla-T4"}') == 3 * 15 * 1024
    assert env.metric('gpushare_cluster_gpu_memory_mib{model="Tesla-V100-SXM2-32GB"}') == 32 * 1024
    pod = create_pod(env.core, pod_body("p", 20))  # only the 32 GiB V100 holds it
    assert env.bind(pod, "mixed") == ""
    env.settled()
    assert env.metric('gpushare_cluster_gpu_memory_allocated_mib{model="Tesla-V100-SXM2-32GB"}') == 20 * 1024
    assert env.metric('gpushare_cluster_gpu_memory_allocated_mib{model="Tesla-T4"}') == 0
    assert env.metric('gpushare_cluster_idle_gpus{model="Tesla-V100-SXM2-32GB"}') == 0
    assert env.metric('gpushare_cluster_idle_gpus{model="Tesla-T4"}') == 3
    assert "gpushare_gpu_memory" not in env.http.get("/metrics").text


def test_metrics_show_the_process_and_its_garbage_collector(cluster: LocalCluster) -> None:
    """CPU, memory and the collector's runs, as every Python exporter shows them; by the time the extender is
    ready, its first list is frozen, full collections (each a pause of every request in flight) are rare, and
    CPython collects by itself only far past its default young threshold (the extender collects after answers)."""
    gc.set_threshold(700, 10, 10)  # CPython's default, as in a fresh process
    with running_extender(cluster) as url:
        env = Env(cluster, url)
        assert gc.get_threshold() == (BACKSTOP * YOUNG, MIDDLE, FULL_COLLECTION_AFTER)
        assert env.metric("process_resident_memory_bytes") > 10 * 2**20
        assert env.metric("process_cpu_seconds_total") > 0
        full = env.metric('python_gc_collections_total{generation="2"}')
        assert full >= 1  # the collection just before the freeze
        gc.collect()
        assert env.metric('python_gc_collections_total{generation="2"}') == full + 1


def test_filter_and_prioritize_make_the_garbage_collection_due_once_they_have_answered(env: Env) -> None:
    """A young or middle collection walks what the memos made since the last one (up to 2 ms): kube-scheduler's
    serial cycle waits for none of it when the extender makes the one due after its answer, not CPython in the middle
    of the next filter."""
    pod = create_pod(env.core, pod_body("p", 5))
    with gc_collections() as collected:
        for verb in ("filter", "prioritize"):
            gc.collect(0)
            collected.clear()
            # Due by CPython's default threshold, far from the extender's backstop.
            kept = [[] for _ in range(2 * YOUNG)]
            assert not collected
            assert env.post(verb, {"Pod": pod, "NodeNames": ["mixed", "t4x2"]}).status_code == 200
            wait_for(lambda: bool(collected), f"the collection due after {verb}'s answer")
            del kept


def test_the_unit_flag_never_overrides_the_unit_a_node_publishes(cluster: LocalCluster) -> None:
    # The local cluster publishes what a device plugin running with --unit GiB does; tests/test_units.py has
    # nodes in MiB and nodes that publish no unit.
    with running_extender(cluster, ExtenderConfig(unit=MemoryUnit.MiB)) as url:
        env = Env(cluster, url)
        assert [d["totalGPU"] for d in env.inspect("mixed")["nodes"][0]["devs"]] == [15, 32]


def test_learning_policy_chosen_by_the_pod(env: Env) -> None:
    for i in range(3):
        create_pod(env.core, pod_body(f"seen{i}", 5))
        env.post("filter", {"Pod": read_pod(env.core, f"seen{i}"), "NodeNames": ["mixed", "t4x2"]})
    pod = create_pod(env.core, pod_body("learner", 5, annotations={"gpushare.io/scheduler-policy": "fgd"}))
    body = env.post("filter", {"Pod": pod, "NodeNames": ["mixed", "t4x2"]}).json()
    assert body["Error"] == "" and len(body["NodeNames"]) == 1
    scores = env.post("prioritize", {"Pod": pod, "NodeNames": ["mixed", "t4x2"]}).json()
    assert sorted(e["Score"] for e in scores)[-1] == 10
    best = next(e["Host"] for e in scores if e["Score"] == 10)
    assert body["NodeNames"] == [best]  # filter chose what prioritize prefers
    assert env.bind(pod, best) == ""
