"""Replay one seed of the openb trace end to end over HTTP, and check it decides as the in-process replay.

    python -m bench.replay_http [--data DIR] [--trace default|FILE.csv] [--seed 42] [--policy NAME] [--pods N]

The cluster is the trace's (``openb.cluster_spec``: GPUs of 1000 MiB) in a ``LocalCluster``; the extender
runs as its own process (``python -m extender --unit MiB --tie-seed SEED --policy P --workload-seed FILE``),
seeded with the trace's shape histogram where ``replay.build_policy`` seeds the in-process policy (``fgd``). Each pod of
the seed's arrival order is created through the kubernetes client and scheduled at once, one at a time and
never retried, by ``SchedulerLoop.schedule_pod``: filter, prioritize (only the extender's favourite gets 10,
and at ``DECISIVE_EXTENDER_WEIGHT`` that outweighs the loop's own scores, as kube-scheduler's) and bind over
HTTP. Its node and GPU indices (read back from the pod's
annotations) are compared with ``replay.replay`` for the same seed and policy.

CPU-only pods (``num_gpu == 0``) ask for no gpushare resource; kube-scheduler calls an extender for them
only when its configuration lists no ``managedResources``. The in-process replay places them with the
policy, so this replay does the same: the loop runs with ``extender_for_all_pods`` (kube-scheduler with an
extender that manages no particular resource) and the extender's policy places them too. The comparison
therefore covers every pod.

The extender learns the workload only from the pods kube-scheduler asks it about: a pod for which no node has
the CPU, memory and GPU memory (kube-scheduler counts ``aliyun.com/gpu-mem`` per node) is unschedulable before
any extender hears of it, so it is not in the policy's histogram. The reference replay therefore shows its
policy only the pods kube-scheduler would ask about (``replay.kube_scheduler_asks``); the output also gives the
comparison with the replay of ``bench.replay``'s tables, whose policy learns from every pod, and counts the
pods the extender never saw. From the first such pod on, the two references can differ.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from bench import openb, replay
from gpushare.clusterspec import ClusterSpec
from gpushare.contract import (
    ANN_GPU_COUNT,
    ANN_NODE_INVENTORY,
    RESOURCE_GPU_COUNT,
    RESOURCE_GPU_MEM,
    MemoryUnit,
    decode_inventory,
    read_assignment,
    unit_annotation,
)
from gpushare.kube.api import MERGE_PATCH
from gpushare.kube.convert import pod_info
from gpushare.localcluster import LocalCluster
from gpushare.localcluster.scheduler import DECISIVE_EXTENDER_WEIGHT, SchedulerLoop
from gpushare.policies import DEFAULT_POLICY, policy_names
from gpushare.policies.workload import count_shapes, dump_workload

UNIT = MemoryUnit.MiB
IMAGE = "registry.local/openb-task:1"
START_TIMEOUT_S = 60.0
EXTENDER_STOP_TIMEOUT_S = 15.0


@dataclass(frozen=True, slots=True)
class HttpReplay:
    """What the end-to-end replay decided, and how long the scheduling took."""

    decisions: list[replay.Decision]
    seconds: float
    unallocated: float  # GPU% left unallocated at the end, as the extender's inspect view reports it
    unseen_by_extender: int  # pods no node had the CPU, memory and GPU memory for, so the loop never asked the extender


@dataclass(frozen=True, slots=True)
class Comparison:
    pods: int
    identical: int
    first_divergence: tuple[replay.Decision, replay.Decision] | None  # (in-process, over HTTP)

    @property
    def percent(self) -> float:
        return 100.0 * self.identical / self.pods if self.pods else 100.0


def pod_manifest(pod: openb.TracePod) -> client.V1Pod:
    """The pod as a user would submit it: the containers, limits and annotations of ``TracePod.pod_info``.

    The GPU count moves from the container limits to the ``gpushare.io/gpu-count`` annotation, as the README
    recommends: kube-scheduler counts ``aliyun.com/gpu-count`` limits against the node's GPU count, so a pod
    sharing a GPU would hold it whole there. The request the extender reads is the same.
    """
    info = pod.pod_info()
    annotations = dict(info.annotations)
    containers = []
    for c in info.containers:
        limits, requests = dict(c.limits), dict(c.requests)
        count = limits.pop(RESOURCE_GPU_COUNT, None)
        requests.pop(RESOURCE_GPU_COUNT, None)
        if count is not None:
            annotations[ANN_GPU_COUNT] = count
        containers.append(client.V1Container(name=c.name, image=IMAGE, resources=client.V1ResourceRequirements(
            limits=limits, requests=requests)))
    return client.V1Pod(api_version="v1", kind="Pod",
                        metadata=client.V1ObjectMeta(name=info.name, namespace=info.namespace,
                                                     annotations=annotations or None),
                        spec=client.V1PodSpec(containers=containers, restart_policy="Never"))


def advertise_in_unit(core: Any, spec: ClusterSpec) -> None:
    """Check every node's inventory gives each GPU 1000 units, and advertise ``aliyun.com/gpu-mem`` in MiB.

    ``LocalCluster`` publishes the capacity and unit as a device plugin running with ``--unit GiB`` would (1000
    MiB rounds to 1 GiB a GPU); this switches both to what a plugin running with ``--unit MiB`` publishes.
    """
    for node in spec.nodes:
        raw = orjson.loads(core.read_node(node.name, _preload_content=False).data)
        inventory = decode_inventory(raw["metadata"]["annotations"][ANN_NODE_INVENTORY])
        units = [UNIT.from_mib(g.memory_mib) for g in inventory]
        if units != [openb.GPU_UNITS] * len(node.gpus):
            raise RuntimeError(f"Node {node.name} publishes GPUs of {units} {UNIT.value}; the replay needs "
                               f"{openb.GPU_UNITS} units per GPU.")
        if node.gpus:
            memory = str(sum(units))
            core.patch_node_status(node.name, {"status": {"capacity": {RESOURCE_GPU_MEM: memory},
                                                          "allocatable": {RESOURCE_GPU_MEM: memory}}},
                                   _content_type=MERGE_PATCH, _preload_content=False)
            core.patch_node(node.name, {"metadata": {"annotations": unit_annotation(UNIT)}},
                            _content_type=MERGE_PATCH, _preload_content=False)


@contextmanager
def extender_process(kubeconfig: Path, seed_file: Path | None, policy: str, seed: int,
                     log_file: Path) -> Iterator[str]:
    """The real extender as a subprocess on an ephemeral port, ready (its caches synced); yields its URL."""
    command = [sys.executable, "-m", "extender", "--host", "127.0.0.1", "--port", "0", "--unit", UNIT.value,
               "--tie-seed", str(seed), "--policy", policy, "--kubeconfig", str(kubeconfig),
               *(("--workload-seed", str(seed_file)) if seed_file else ())]
    with log_file.open("w") as log:
        process = subprocess.Popen(command, stderr=log, cwd=openb.REPO_ROOT)
    try:
        [url] = wait_for_urls(process, log_file)
        deadline = time.monotonic() + START_TIMEOUT_S
        while httpx.get(url + "/readyz").status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"The extender did not get ready within {START_TIMEOUT_S:.0f} s; see {log_file}.")
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=EXTENDER_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for_urls(process: subprocess.Popen[bytes], log_file: Path, count: int = 1) -> list[str]:
    """The URLs of the extender's ``count`` listeners (the verbs', and a health port's if it was given one), from
    its log, once it serves them all."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        urls = []
        for line in log_file.read_text().splitlines():
            message = str(orjson.loads(line).get("msg", "")) if line.startswith("{") else ""
            if message.startswith("Uvicorn running on "):
                urls.append(message.split()[3])
        if len(urls) >= count:
            return urls
        if process.poll() is not None:
            raise RuntimeError(f"The extender exited with status {process.returncode}: "
                               f"{log_file.read_text().strip()}")
        time.sleep(0.05)
    raise RuntimeError(f"The extender did not start serving within {START_TIMEOUT_S:.0f} s; see {log_file}.")


def _filter_calls(url: str) -> int:
    """How many filter requests the extender has answered."""
    text = httpx.get(url + "/metrics").text
    return int(sum(sample.value for family in text_string_to_metric_families(text)
                   if family.name == "gpushare_extender_requests" for sample in family.samples
                   if sample.name.endswith("_total") and sample.labels.get("verb") == "filter"))


def replay_over_http(trace_nodes: Sequence[openb.TraceNode], trace_pods: Sequence[openb.TracePod],
                     order: Sequence[openb.TracePod], policy: str, seed: int, workdir: Path) -> HttpReplay:
    """Schedule ``order`` through a local cluster, the extender process and the scheduler loop."""
    spec = openb.cluster_spec(trace_nodes)
    # Seeded exactly when ``replay.build_policy`` seeds the in-process policy.
    seed_file: Path | None = None
    if policy in replay.SEEDED_POLICIES:
        seed_file = workdir / "workload-seed.yaml"
        seed_file.write_text(dump_workload(count_shapes(p.request() for p in trace_pods)))
    with LocalCluster(spec, publish_inventory=True) as cluster:
        core: Any = client.CoreV1Api(cluster.api_client())
        advertise_in_unit(core, spec)
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=openb.NAMESPACE)),
                              _preload_content=False)
        kubeconfig = cluster.write_kubeconfig(workdir / "kubeconfig")
        with extender_process(kubeconfig, seed_file, policy, seed, workdir / "extender.log") as url:
            # The extender's single 10 picks the node at this weight, whatever the loop's own scores say; ties
            # cannot arise. Every node is a candidate (percentageOfNodesToScore 100), as in the in-process replay.
            with SchedulerLoop(cluster.api_client(), url + "/gpushare-scheduler", weight=DECISIVE_EXTENDER_WEIGHT,
                               seed=seed, extender_for_all_pods=True, percentage_of_nodes_to_score=100) as loop:
                started = time.perf_counter()
                for pod in order:
                    core.create_namespaced_pod(openb.NAMESPACE, pod_manifest(pod), _preload_content=False)
                    loop.schedule_pod(pod.name, openb.NAMESPACE)
                seconds = time.perf_counter() - started
            unseen = len(order) - _filter_calls(url)
            unallocated = _unallocated(httpx.get(url + "/gpushare-scheduler/inspect", timeout=60).json()["nodes"])
        listed = orjson.loads(core.list_namespaced_pod(openb.NAMESPACE, _preload_content=False).data)["items"]
    placed = {}
    for obj in listed:
        info = pod_info(obj)
        assignment = read_assignment(info)
        placed[info.name] = (info.node_name or None, assignment.gpu_indices if assignment else ())
    decisions = [replay.Decision(p.name, *placed.get(p.name, (None, ()))) for p in order]
    return HttpReplay(decisions, seconds, unallocated, unseen)


def _unallocated(nodes: Sequence[dict[str, Any]]) -> float:
    total = sum(int(n["totalGPU"]) for n in nodes)
    used = sum(int(n["usedGPU"]) for n in nodes)
    return 100.0 - 100.0 * used / total if total else 0.0


def replay_in_process(trace_nodes: Sequence[openb.TraceNode], trace_pods: Sequence[openb.TracePod],
                      order: Sequence[openb.TracePod], policy: str, seed: int, *, every_pod_shown: bool = False
                      ) -> tuple[list[replay.Decision], float]:
    """``replay.replay``'s decisions, and the GPU% it leaves unallocated at the end: the policy learns from the
    pods kube-scheduler asks the extender about, as over HTTP, or with ``every_pod_shown`` from every pod (the
    replay of ``bench.replay``'s tables)."""
    nodes = openb.build_nodes(trace_nodes)
    decisions = list(replay.replay(nodes, order, replay.build_policy(policy, trace_pods, nodes), seed,
                                   shown_as_by_kube_scheduler=not every_pod_shown))
    total = sum(g.total for n in nodes for g in n.gpus)
    used = sum(g.used for n in nodes for g in n.gpus)
    return decisions, 100.0 - 100.0 * used / total


def compare(expected: Sequence[replay.Decision], actual: Sequence[replay.Decision]) -> Comparison:
    identical = 0
    first: tuple[replay.Decision, replay.Decision] | None = None
    for want, got in zip(expected, actual, strict=True):
        if want == got:
            identical += 1
        elif first is None:
            first = (want, got)
    return Comparison(len(expected), identical, first)


def _describe(decision: replay.Decision) -> str:
    if decision.node is None:
        return "not placed"
    return f"node {decision.node}, GPUs {list(decision.gpus)}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=openb.DEFAULT_DATA, help="folder with the openb CSV files")
    parser.add_argument("--trace", default="default",
                        help=f"an openb trace of --data ({', '.join(openb.TRACES)}), or a pod list file of the same "
                             "columns on --data's nodes (bench.vary_trace writes such files)")
    parser.add_argument("--seed", type=int, default=openb.SEEDS[0])
    parser.add_argument("--policy", choices=policy_names(), default=DEFAULT_POLICY)
    parser.add_argument("--pods", type=int, default=None, help="replay only the first N pods of the arrival order")
    args = parser.parse_args(argv)
    if args.pods is not None and args.pods < 1:
        parser.error(f"--pods {args.pods} must be at least 1")
    try:
        trace_nodes = openb.load_nodes(args.data)
        trace_pods = openb.load_pods(args.data, args.trace)
    except openb.TraceError as exc:
        print(exc, file=sys.stderr)
        return 2
    order = openb.arrival_order(trace_pods, args.seed, openb.capacity(trace_nodes))[:args.pods]
    started = time.perf_counter()
    expected, expected_unallocated = replay_in_process(trace_nodes, trace_pods, order, args.policy, args.seed)
    in_process_s = time.perf_counter() - started
    with tempfile.TemporaryDirectory(prefix="replay-http-") as workdir:
        outcome = replay_over_http(trace_nodes, trace_pods, order, args.policy, args.seed, Path(workdir))
    comparison = compare(expected, outcome.decisions)
    every_pod, _ = replay_in_process(trace_nodes, trace_pods, order, args.policy, args.seed, every_pod_shown=True)
    against_every_pod = compare(every_pod, outcome.decisions)
    cpu_only = sum(1 for p in order if not p.num_gpu)
    print(f"openb {openb.trace_name(args.trace)} trace, seed {args.seed}, policy {args.policy}: {len(order)} pods "
          f"replayed over HTTP ({cpu_only} CPU-only, placed through the extender like the rest; "
          f"{len(trace_nodes)} nodes)")
    print(f"identical decisions (node and GPU indices): {comparison.identical}/{comparison.pods} "
          f"({comparison.percent:.2f}%)")
    if comparison.first_divergence is None:
        print("first divergence: none")
    else:
        want, got = comparison.first_divergence
        print(f"first divergence: pod {want.pod}: in-process {_describe(want)}; over HTTP {_describe(got)}")
    print(f"placed: in-process {sum(d.node is not None for d in expected)}, "
          f"over HTTP {sum(d.node is not None for d in outcome.decisions)}; pods the extender never saw (no node "
          f"had the CPU, memory and GPU memory in all): {outcome.unseen_by_extender}")
    print(f"unallocated GPU% at the end: in-process {expected_unallocated:.2f}, over HTTP {outcome.unallocated:.2f}")
    print(f"against the in-process replay whose policy also learns from the pods the extender never saw (that of "
          f"bench.replay's tables): {against_every_pod.identical}/{against_every_pod.pods} identical")
    print(f"wall time: over HTTP {outcome.seconds:.1f} s ({len(order) / outcome.seconds:.1f} pods/s, "
          f"{os.cpu_count()} CPUs); in-process {in_process_s:.1f} s")
    return 0 if comparison.identical == comparison.pods else 1


if __name__ == "__main__":
    sys.exit(main())
