"""An API server that stops answering: the local API server runs as a process of its own and is SIGSTOPped.

Binds answer within their budget with a sentence and leave no reservation behind; /healthz, /readyz and /metrics
keep answering in milliseconds; once the API server resumes, the cache equals the annotations and binds work.
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from kubernetes import client
from test_extender_harness import T4, T4_MIB, create_pod, gpu_node, pod_body, read_pod, serve, spec, wait_for
from test_extender_hostile import assert_cache_equals_annotations

from bench.faults import stop_process
from extender.app import create_app
from extender.config import ExtenderConfig
from gpushare.kube.api import DEFAULT_TIMEOUT_S, Kube, Pods
from gpushare.kube.client import load_configuration

BUDGET_S = 1.0
# The budget, and room for a loaded test host.
ANSWER_BOUND_S = BUDGET_S + 1.0
HEALTH_BOUND_S = 0.25


@pytest.fixture
def api_server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """``gpushare-local-cluster`` as a child process, and its kubeconfig."""
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text(yaml.safe_dump(spec(gpu_node("t4x2", (T4, T4_MIB), (T4, T4_MIB))).model_dump(mode="json")))
    kubeconfig = tmp_path / "kubeconfig"
    process = subprocess.Popen(
        [sys.executable, "-m", "gpushare.localcluster", "--cluster", str(cluster_file), "--port", "0",
         "--kubeconfig", str(kubeconfig), "--log-level", "WARNING"], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline().startswith("http://")
        yield process, kubeconfig
    finally:
        process.send_signal(signal.SIGCONT)
        process.terminate()
        process.wait(timeout=15)
        if process.stdout is not None:
            process.stdout.close()


class FreezeBeforeBinding(Pods):
    """The extender's pod calls; the first Binding finds the API server stopped (SIGSTOP) just before it."""

    def __init__(self, api_client: client.ApiClient, pid: int) -> None:
        super().__init__(api_client)
        self.pid = pid
        self.frozen = threading.Event()

    def bind(self, namespace: str, name: str, uid: str, node: str, *, annotations: Mapping[str, str] | None = None,
             resource_version: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if not self.frozen.is_set():
            self.frozen.set()
            stop_process(self.pid)
        super().bind(namespace, name, uid, node, annotations=annotations, resource_version=resource_version,
                     timeout_s=timeout_s)


class Probe:
    """Times /healthz, /readyz and /metrics in a loop while something else happens."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.slowest = 0.0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=5) as http:
            while not self._stop.is_set():
                for path in ("/healthz", "/readyz", "/metrics"):
                    start = time.perf_counter()
                    status = http.get(path).status_code
                    self.slowest = max(self.slowest, time.perf_counter() - start)
                    if status != 200:
                        self.failures.append(f"{path}: {status}")
                time.sleep(0.02)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def bind(http: httpx.Client, pod: dict[str, Any]) -> tuple[str, float]:
    """Filter (answered from the cache) and bind, as kube-scheduler does; the bind's Error and time."""
    http.post("/gpushare-scheduler/filter", content=orjson.dumps({"Pod": pod, "NodeNames": ["t4x2"]}))
    start = time.perf_counter()
    response = http.post("/gpushare-scheduler/bind", content=orjson.dumps({
        "PodName": pod["metadata"]["name"], "PodNamespace": "default", "PodUID": pod["metadata"]["uid"],
        "Node": "t4x2"}))
    elapsed = time.perf_counter() - start
    assert response.status_code == 200
    return str(response.json()["Error"]), elapsed


def reservations(http: httpx.Client) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("gpushare_extender_reservations "):
            return float(line.split()[1])
    raise AssertionError("no reservations gauge")


def test_binds_answer_within_their_budget_while_the_api_server_is_stopped(
        api_server: tuple[subprocess.Popen[str], Path]) -> None:
    process, kubeconfig = api_server
    api_client = client.ApiClient(load_configuration(kubeconfig))
    core = client.CoreV1Api(client.ApiClient(load_configuration(kubeconfig)))
    pods = FreezeBeforeBinding(api_client, process.pid)
    app = create_app(ExtenderConfig(bind_timeout_s=BUDGET_S),
                     dataclasses.replace(Kube.from_api_client(api_client), pods=pods))
    with serve(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        wait_for(lambda: http.get("/readyz").status_code == 200, "the extender to be ready")
        first = create_pod(core, pod_body("first", 4))
        second = create_pod(core, pod_body("second", 4))
        with Probe(url) as probe:
            # Stopped just before the Binding: its answer never comes.
            error, first_elapsed = bind(http, first)
            assert pods.frozen.is_set()
            assert f"within its {BUDGET_S:g} s budget" in error and "did not answer within" in error, error
            assert first_elapsed < ANSWER_BOUND_S, first_elapsed
            assert reservations(http) == 0
            # Stopped before the bind starts: its one API call (the Binding; the pod itself comes from the
            # extender's watch) gets no answer.
            error, elapsed = bind(http, second)
            assert f"within its {BUDGET_S:g} s budget" in error, error
            assert "bind pod default/second to node t4x2" in error, error
            assert elapsed < ANSWER_BOUND_S, elapsed
            assert reservations(http) == 0
        print(f"\nbinds answered in {first_elapsed:.2f} s and {elapsed:.2f} s with a {BUDGET_S:g} s budget; slowest "
              f"health/ready/metrics answer while stopped: {probe.slowest * 1000:.1f} ms")
        assert not probe.failures, probe.failures
        assert probe.slowest < HEALTH_BOUND_S, probe.slowest
        process.send_signal(signal.SIGCONT)
        # The first pod's Binding was on its way when the server stopped, and lands now (bound with its
        # annotations) or not at all (unbound, no annotations). Either way the cache agrees.
        assert_cache_equals_annotations(core, http)
        assert bind(http, read_pod(core, "second"))[0] == ""
        assert read_pod(core, "second")["spec"]["nodeName"] == "t4x2"
        assert_cache_equals_annotations(core, http)


def test_a_flood_of_binds_is_answered_at_once_past_the_limit(api_server: tuple[subprocess.Popen[str], Path]) -> None:
    process, kubeconfig = api_server
    api_client = client.ApiClient(load_configuration(kubeconfig))
    core = client.CoreV1Api(api_client)
    app = create_app(ExtenderConfig(bind_timeout_s=BUDGET_S, max_binds=2), Kube.from_api_client(api_client))
    with serve(app) as url, httpx.Client(base_url=url, timeout=10) as http:
        wait_for(lambda: http.get("/readyz").status_code == 200, "the extender to be ready")
        created = [create_pod(core, pod_body(f"flood-{i}", 1)) for i in range(12)]
        process.send_signal(signal.SIGSTOP)
        answers: list[tuple[str, float]] = []
        with Probe(url) as probe:
            def send(pod: dict[str, Any]) -> None:
                with httpx.Client(base_url=url, timeout=10) as own:
                    answers.append(bind(own, pod))

            threads = [threading.Thread(target=send, args=(p,)) for p in created]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=10)
        busy = [elapsed for error, elapsed in answers if "2 binds are already in flight" in error]
        waited = [elapsed for error, elapsed in answers if "budget" in error]
        print(f"\n{len(busy)} binds refused at once (slowest {max(busy) * 1000:.0f} ms), {len(waited)} ran out of "
              f"their budget (slowest {max(waited):.2f} s); slowest health answer {probe.slowest * 1000:.1f} ms")
        assert len(answers) == 12 and len(busy) >= 10 and len(busy) + len(waited) == 12
        assert max(busy) < 0.5 and max(waited) < ANSWER_BOUND_S
        assert not probe.failures and probe.slowest < HEALTH_BOUND_S
        process.send_signal(signal.SIGCONT)
        assert reservations(http) == 0
