"""The scheduler loop drives an extender with kube-scheduler's real call pattern (REFERENCE.md section 1b).

A recording extender on loopback sees what kube-scheduler would send: only the first ``numFeasibleNodesToFind``
feasible nodes, starting where the previous cycle stopped; the next pods' filters while earlier binds are
still in flight; a failed bind sent to backoff and retried.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from conftest import answer_json
from kubernetes import client
from test_extender_harness import create_pod, pod_body, read_pod, wait_for

from gpushare.clusterspec import ClusterSpec
from gpushare.localcluster import LocalCluster
from gpushare.localcluster.scheduler import SchedulerLoop, num_feasible_nodes_to_find


class Recorder:
    """What the extender was asked, in order, with the time of each call's arrival and answer."""

    def __init__(self, bind_delay_s: float = 0.0, failing_binds: int = 0) -> None:
        self.calls: list[tuple[str, float, Any]] = []
        self.answered: dict[str, float] = {}
        self.bind_delay_s = bind_delay_s
        self.failing_binds = failing_binds
        self.lock = threading.Lock()
        self.core: client.CoreV1Api | None = None

    def handle(self, verb: str, body: Any) -> Any:
        with self.lock:
            self.calls.append((verb, time.monotonic(), body))
        if verb == "filter":
            return {"NodeNames": body["NodeNames"], "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": ""}
        if verb == "prioritize":
            return [{"Host": name, "Score": 10 if i == 0 else 0} for i, name in enumerate(body["NodeNames"])]
        time.sleep(self.bind_delay_s)
        with self.lock:
            fail = self.failing_binds > 0
            self.failing_binds -= fail
        if fail:
            return {"Error": "the API server is busy; try again"}
        assert self.core is not None
        self.core.create_namespaced_binding(body["PodNamespace"], client.V1Binding(
            metadata=client.V1ObjectMeta(name=body["PodName"], uid=body["PodUID"]),
            target=client.V1ObjectReference(kind="Node", name=body["Node"])), _preload_content=False)
        with self.lock:
            self.answered[body["PodName"]] = time.monotonic()
        return {"Error": ""}

    def verbs(self, verb: str) -> list[tuple[float, Any]]:
        with self.lock:
            return [(at, body) for v, at, body in self.calls if v == verb]


@pytest.fixture
def recorder() -> Iterator[tuple[Recorder, str]]:
    record = Recorder()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            answer_json(self, json.dumps(record.handle(self.path.rsplit("/", 1)[-1], body)).encode())

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield record, f"http://127.0.0.1:{server.server_address[1]}/gpushare-scheduler"
    finally:
        server.shutdown()
        server.server_close()


def cluster_of(nodes: int) -> ClusterSpec:
    return ClusterSpec.model_validate({"nodes": [
        {"name": f"n{i:03d}", "gpus": [{"model": "T4", "memoryMiB": 15360}]} for i in range(nodes)]})


@pytest.mark.parametrize(("nodes", "percentage", "expected"), [
    (50, 0, 50), (100, 0, 100), (150, 0, 100), (1000, 0, 420), (5000, 0, 500), (15000, 0, 750),
    (5000, 100, 5000), (5000, 1, 100)])
def test_num_feasible_nodes_to_find_is_kube_schedulers(nodes: int, percentage: int, expected: int) -> None:
    assert num_feasible_nodes_to_find(nodes, percentage) == expected


def test_filter_sees_the_first_feasible_nodes_from_a_rotating_start(recorder: tuple[Recorder, str]) -> None:
    record, url = recorder
    with LocalCluster(cluster_of(150)) as cluster:
        core = client.CoreV1Api(cluster.api_client())
        record.core = core
        for name in ("first", "second"):
            create_pod(core, pod_body(name, 1))
        with SchedulerLoop(cluster.api_client(), url, seed=1) as loop:
            assert loop.schedule_pod("first").scheduled and loop.schedule_pod("second").scheduled
    (_, first), (_, second) = record.verbs("filter")
    # 150 nodes: max(150 x 48 / 100, 100) = 100 names; the second cycle starts where the first stopped.
    assert first["NodeNames"] == [f"n{i:03d}" for i in range(100)]
    assert second["NodeNames"] == [f"n{i:03d}" for i in (*range(100, 150), *range(50))]
    assert len(record.verbs("prioritize")) == 2
    assert loop.stats.nodes_checked == [100, 100]


def test_a_cycle_counts_the_nodes_it_passed_over_to_find_enough_feasible_ones(recorder: tuple[Recorder, str]) -> None:
    record, url = recorder
    # The first 50 nodes have no GPU: a GPU pod fails the loop's own check there, and the cycle goes on to n149.
    spec = ClusterSpec.model_validate({"nodes": [
        {"name": f"n{i:03d}", "gpus": [] if i < 50 else [{"model": "T4", "memoryMiB": 15360}]} for i in range(150)]})
    with LocalCluster(spec) as cluster:
        core = client.CoreV1Api(cluster.api_client())
        record.core = core
        create_pod(core, pod_body("first", 1))
        with SchedulerLoop(cluster.api_client(), url, seed=1) as loop:
            assert loop.schedule_pod("first").scheduled
    (_, first), = record.verbs("filter")
    assert first["NodeNames"] == [f"n{i:03d}" for i in range(50, 150)]
    assert loop.stats.nodes_checked == [150]


def test_binds_run_in_the_background_while_the_next_pods_are_scheduled(recorder: tuple[Recorder, str]) -> None:
    record, url = recorder
    record.bind_delay_s = 0.5
    with LocalCluster(cluster_of(3)) as cluster:
        core = client.CoreV1Api(cluster.api_client())
        record.core = core
        names = [f"p{i}" for i in range(4)]
        for name in names:
            create_pod(core, pod_body(name, 1))
        with SchedulerLoop(cluster.api_client(), url, seed=1) as loop:
            loop.start()
            wait_for(lambda: all(read_pod(core, n)["spec"].get("nodeName") for n in names), "every pod bound")
    filters = sorted(at for at, _ in record.verbs("filter"))
    first_bind_answered = min(record.answered.values())
    assert len(filters) == 4 and filters[-1] < first_bind_answered  # every cycle ran before any bind returned


def test_a_failed_bind_is_forgotten_and_retried_with_backoff(recorder: tuple[Recorder, str]) -> None:
    record, url = recorder
    record.failing_binds = 1
    with LocalCluster(cluster_of(2)) as cluster:
        core = client.CoreV1Api(cluster.api_client())
        record.core = core
        create_pod(core, pod_body("unlucky", 1))
        with SchedulerLoop(cluster.api_client(), url, seed=1) as loop:
            loop.start()
            wait_for(lambda: bool(read_pod(core, "unlucky")["spec"].get("nodeName")), "the retry", timeout_s=15)
    binds = record.verbs("bind")
    assert len(binds) == 2 and binds[1][0] - binds[0][0] >= 0.9  # kube-scheduler's first backoff is 1 s


def test_without_an_extender_the_loop_accounts_gpu_memory_itself() -> None:
    with LocalCluster(cluster_of(1)) as cluster:  # one T4: 15 units of aliyun.com/gpu-mem
        core = client.CoreV1Api(cluster.api_client())
        for name, units in (("ten", 10), ("five", 5), ("one-more", 1)):
            create_pod(core, pod_body(name, units))
        with SchedulerLoop(cluster.api_client(), None, seed=1) as loop:
            assert loop.schedule_pod("ten").node == loop.schedule_pod("five").node == "n000"
            refused = loop.schedule_pod("one-more")
    assert refused.message == ("0/1 nodes are available: 1 Insufficient aliyun.com/gpu-mem. preemption: 0/1 nodes "
                               "are available: 1 No preemption victims found for incoming pod.")
