"""The workload the learning policies start from (``--workload-seed``), and pods without GPUs in the extender."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_extender_harness import (
    T4,
    T4_MIB,
    create_pod,
    emptied_core,
    gpu_node,
    metric,
    pod_body,
    read_pod,
    running_extender,
    spec,
)

from extender.config import ConfigError, ExtenderConfig, parse_config
from extender.placement import PolicyBook
from gpushare.contract import ANN_IDX, ModelRule, PodRequest
from gpushare.kube.api import DEFAULT_TIMEOUT_S, Pods
from gpushare.localcluster import LocalCluster
from gpushare.localcluster.scheduler import SchedulerLoop
from gpushare.policies import make_policy, node_priority
from gpushare.policies.workload import Shape, WorkloadDistribution, count_shapes, dump_workload, load_workload

REQUESTS = [PodRequest(per_gpu=460, cpu_milli=6000)] * 7 + [PodRequest(per_gpu=1000, cpu_milli=8000)] * 5 + [
    PodRequest(per_gpu=1000, gpu_count=2, cpu_milli=16000, models=ModelRule(("v100m16", "v100m32")))] * 2 + [
    PodRequest(per_gpu=0, gpu_count=0, cpu_milli=12000)] * 3


def seed_file(folder: Path, requests: list[PodRequest]) -> Path:
    path = folder / "seed.yaml"
    path.write_text(dump_workload(count_shapes(requests)))
    return path


def test_a_seed_file_starts_the_workload_as_the_replay_seeds_it(tmp_path: Path) -> None:
    book = PolicyBook("fgd-lookahead", load_workload(seed_file(tmp_path, REQUESTS)))
    replay = WorkloadDistribution()
    replay.seed(count_shapes(REQUESTS), observations=len(REQUESTS))  # as bench.replay.workload_for does
    assert book.workload.target == replay.target
    assert book.workload.histogram() == pytest.approx(replay.histogram())
    # Both count the seed as that many pods: the next observations move them alike.
    for i, request in enumerate(REQUESTS[::-1] * 40):
        book.observe_once(f"uid-{i}", request)
        replay.observe(Shape.of(request))
    assert book.workload.target == replay.target
    assert book.workload.version == replay.version


@pytest.mark.parametrize("policy", ["fgd-scarcity", "fgd-lookahead", "fgd"])
def test_the_default_policy_learns_its_workload_as_the_replay_builds_it(policy: str) -> None:
    book = PolicyBook(policy)
    replay = make_policy(policy)  # as bench.replay.build_policy makes an unseeded policy
    # Rare shapes too: fgd-scarcity's target counts every shape, the others' the most frequent 95%.
    requests = [PodRequest(per_gpu=16, gpu_count=8, cpu_milli=120_000)] + REQUESTS * 30
    for i, request in enumerate(requests):
        book.observe_once(f"uid-{i}", request)
        replay.observe(request)
    learned = book.for_request(REQUESTS[0]).workload  # type: ignore[attr-defined]
    assert learned.target == replay.workload.target  # type: ignore[attr-defined]
    assert learned.version == replay.workload.version  # type: ignore[attr-defined]


def test_a_pod_without_gpu_is_counted_once() -> None:
    book = PolicyBook("fgd")
    cpu_only = PodRequest(per_gpu=0, gpu_count=0, cpu_milli=12000)
    book.observe_once("uid-1", cpu_only)
    book.observe_once("uid-1", cpu_only)
    assert book.workload.histogram() == {Shape(0, 0, 12000): 1.0}


def test_a_bound_pod_is_forgotten_and_counts_again_only_if_filtered_after_its_bind() -> None:
    book = PolicyBook("fgd")
    one, other = PodRequest(per_gpu=4, cpu_milli=1000), PodRequest(per_gpu=8, cpu_milli=1000)
    book.observe_once("uid-1", one)
    book.forget("uid-1")  # bound: kube-scheduler filters it no more
    book.forget("uid-2")  # never observed: nothing to forget
    book.observe_once("uid-1", one)
    book.observe_once("uid-2", other)
    book.observe_once("uid-2", other)
    # Counted twice against once (later pods weigh a little more: the workload forgets slowly).
    assert book.workload.histogram() == pytest.approx({Shape(1, 4, 1000): 2 / 3, Shape(1, 8, 1000): 1 / 3}, rel=1e-3)


def test_the_flag_reads_the_file(tmp_path: Path) -> None:
    path = seed_file(tmp_path, REQUESTS)
    assert parse_config(["--workload-seed", str(path)]).workload_seed == path
    assert parse_config([]).workload_seed is None


@pytest.mark.parametrize(("text", "message"), [
    ("shapes: []", "needs a non-empty list under 'shapes'"),
    ("shapes: [{gpuCount: -1, perGPU: 100}]", "Shape 0 of the workload seed .* is invalid"),
    ("shapes: [{gpuCount: 1, perGPU: 100, weight: 0}]", "gives every shape weight 0"),
    ("shapes: [oops", "is not valid YAML or JSON"),
])
def test_a_bad_seed_file_is_a_sentence(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "seed.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        parse_config(["--workload-seed", str(path)])


def test_a_missing_seed_file_stops_the_process_with_status_2(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "extender", "--workload-seed", str(tmp_path / "none.yaml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert f"gpushare-extender: {tmp_path / 'none.yaml'} does not exist or is not a file." in result.stderr


# Two GPU nodes: 'dense' has 8 GPUs and just the cores for eight 2-core tasks; 'roomy' one GPU and many cores.
CLUSTER = spec(gpu_node("dense", *[(T4, T4_MIB)] * 8, cpu="16"), gpu_node("roomy", (T4, T4_MIB), cpu="64"))
TASKS = [PodRequest(per_gpu=T4_MIB // 1024, cpu_milli=2000)] * 10  # whole T4s, in GiB
FILTERS = 'gpushare_extender_requests_total{code="200",verb="filter"}'


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(CLUSTER) as local:
        yield local


@pytest.fixture
def core(cluster: LocalCluster) -> Any:
    return emptied_core(cluster)


def test_the_policy_places_a_pod_without_gpu(cluster: LocalCluster, core: Any, tmp_path: Path) -> None:
    # 8 cores on 'dense' would strand four of its GPUs for the seeded 2-core tasks; 'roomy' loses nothing.
    pod = create_pod(core, pod_body("plain", cpu="8"))
    with running_extender(cluster, ExtenderConfig(policy="fgd-lookahead", workload_seed=seed_file(tmp_path, TASKS))
                          ) as url:
        args = {"Pod": pod, "Nodes": None, "NodeNames": ["dense", "roomy"]}
        filtered = httpx.post(url + "/gpushare-scheduler/filter", json=args).json()
        assert filtered["NodeNames"] == ["dense", "roomy"] and filtered["Error"] == ""
        scores = httpx.post(url + "/gpushare-scheduler/prioritize", json=args).json()
        assert {h["Host"]: h["Score"] for h in scores}["roomy"] == 10
        assert {h["Host"]: h["Score"] for h in scores}["dense"] < 10


def test_the_loop_sends_pods_without_gpu_to_the_extender_when_asked(cluster: LocalCluster, core: Any,
                                                                   tmp_path: Path) -> None:
    create_pod(core, pod_body("plain", cpu="8"))
    create_pod(core, pod_body("other", cpu="8"))
    with running_extender(cluster, ExtenderConfig(policy="fgd-lookahead", workload_seed=seed_file(tmp_path, TASKS))
                          ) as url:
        with SchedulerLoop(cluster.api_client(), url + "/gpushare-scheduler", seed=1,
                           extender_for_all_pods=True) as loop:
            assert loop.schedule_pod("plain").node == "roomy"
        assert metric(url, FILTERS) == 1
        with SchedulerLoop(cluster.api_client(), url + "/gpushare-scheduler", seed=1) as loop:
            # on its own the loop scores by kube-scheduler's plugins: 'roomy' has the most CPU left after the pod
            assert loop.schedule_pod("other").node == "roomy"
        assert metric(url, FILTERS) == 1  # no call for a pod without GPUs
    assert ANN_IDX not in (read_pod(core, "plain")["metadata"].get("annotations") or {})


class ReservationCountingPods(Pods):
    """The extender's pod calls, except that the Binding first reads the extender's reservations gauge."""

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__(cluster.api_client())
        self.url = ""
        self.seen: list[float] = []

    def bind(self, namespace: str, name: str, uid: str, node: str, *, annotations: Mapping[str, str] | None = None,
             resource_version: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        metrics = httpx.get(self.url + "/metrics").text
        self.seen.extend(float(line.split()[-1]) for line in metrics.splitlines()
                         if line.startswith("gpushare_extender_reservations "))
        super().bind(namespace, name, uid, node, annotations=annotations, resource_version=resource_version,
                     timeout_s=timeout_s)


def test_bind_reserves_cpu_before_the_binding(cluster: LocalCluster, core: Any) -> None:
    pod = create_pod(core, pod_body("plain", cpu="8"))
    pods = ReservationCountingPods(cluster)
    with running_extender(cluster, pods=pods) as url:
        pods.url = url
        httpx.post(url + "/gpushare-scheduler/filter", json={"Pod": pod, "NodeNames": ["roomy"]})
        answer = httpx.post(url + "/gpushare-scheduler/bind", json={
            "PodName": "plain", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": "roomy"})
        assert answer.json() == {"Error": ""}
    assert pods.seen == [1.0]
    assert read_pod(core, "plain")["spec"]["nodeName"] == "roomy"


# Two 128-core nodes are the only ones with the cores for an 8-GPU, 120-core pod; fourteen 96-core nodes are not.
GPU_16G = ("G", 16384)
SIZES = spec(*(gpu_node(f"large-{i}", *[GPU_16G] * 8, cpu="128") for i in range(2)),
             *(gpu_node(f"small-{i}", *[GPU_16G] * 8, cpu="96") for i in range(14)))
# One pod in 200 is such a pod; the rest take one whole GPU and 12 cores (the extender's unit is GiB).
SIZED_TASKS = [PodRequest(per_gpu=16, gpu_count=8, cpu_milli=120000)] + [
    PodRequest(per_gpu=16, cpu_milli=12000)] * 199


def test_the_extender_keeps_the_only_nodes_a_large_pod_fits_for_it(tmp_path: Path) -> None:
    names = [n.name for n in SIZES.nodes]
    # Without the reserve every node ties for this pod, and with this tie seed the tie goes to a large node.
    seed = next(s for s in range(100) if max(names, key=lambda n: node_priority(n, s)).startswith("large"))
    with LocalCluster(SIZES) as local:
        core = emptied_core(local)
        pod = create_pod(core, pod_body("cpu-heavy", gpu_mem=16, cpu="12"))
        with running_extender(local, ExtenderConfig(workload_seed=seed_file(tmp_path, SIZED_TASKS),
                                                         tie_seed=seed)) as url:
            args = {"Pod": pod, "Nodes": None, "NodeNames": names}
            [chosen] = httpx.post(url + "/gpushare-scheduler/filter", json=args).json()["NodeNames"]
            scores = {h["Host"]: h["Score"] for h in httpx.post(url + "/gpushare-scheduler/prioritize",
                                                                 json=args).json()}
    assert chosen.startswith("small") and scores[chosen] == 10
    assert all(scores[f"large-{i}"] < scores["small-0"] for i in range(2))
