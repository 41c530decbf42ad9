"""GPU scheduling throughput end to end, driven the way kube-scheduler drives an extender, against its floor.

    .venv/bin/python -m bench.bench_throughput [--nodes 5000,15000] [--pods 10000] [--policies all]
                                               [--node-choices filter,prioritize]
                                               [--data ../shared/data/openb] [--trace default|FILE.csv]
                                               [--seed 42] [--host-requests fixed|trace]
                                               [--fleet uniform|openb] [--scrape-interval 15] [--rounds 1]
                                               [--transports http,mtls-ecdsa,mtls-rsa]

For each cluster size a local API server holds ``--nodes`` nodes. With ``--fleet uniform`` (the default) each has
8 x 16 GiB GPUs, 96 CPUs and 768 GiB. ``--pods`` pending pods are created first, their GPU shapes drawn from an
openb trace (``--trace``, a name or a pod list file of the same columns: fractional, whole-GPU and multi-GPU pods,
in the trace's proportions, which differ across the family: multigpu30 has more multi-GPU pods, gpushare60 more
fractional ones; memory = the trace's GPU fraction x 16 GiB, at least 1 GiB; model constraints dropped, since
every GPU here is the same), each requesting 1 CPU and 2 GiB, or with ``--host-requests trace`` its trace pod's
CPU and memory. With ``--fleet openb`` the nodes are openb's own cluster repeated to the size asked for (node i is
the node list's node i modulo its length: nine models, 1, 2, 4 or 8 GPUs, their CPUs and memory), every GPU
counted as 1000 MiB as the replay counts it (the extender runs with ``--unit MiB``), and each pod asks for its
trace pod's GPU share in MiB and keeps its model constraint: a fleet of many node shapes and far more distinct
node states than the uniform one. Then the local cluster's scheduler loop schedules them all with
kube-scheduler's pattern (serial cycles over the first ``numFeasibleNodesToFind`` feasible nodes from a
rotating start, prioritize when more than one node passed, binds in the background):

* **floor**: the same loop with no extender (it accounts ``aliyun.com/gpu-mem`` itself and binds directly), first
  and again after the last row: the machine's pace drifts over a run, so each ratio is to the mean of the two;
  with ``--rounds N`` the rows below run N times, each round followed by the floor again, each row's ratio is to
  the floors just before and after it, and a second table gives each setup's median pods/s and the median and
  range of its ratios over the rounds (on this project's 2-core machine the floor alone moved between 417 and
  299 pods/s within six minutes while the extender's rows between those floors held 274-277);
* **null extender** (``bench.null_extender``): the loop through an extender that only passes the first name and
  makes the plain Binding, on the same HTTP stack: what the round trips cost, so that the gap between it and a
  policy's row is the extender's own work;
* **one row per policy and node choice** (``--node-choices``): the extender as its own process over HTTP, with
  ``--node-choice filter`` (filter passes only the policy's favourite, so the loop skips prioritize) or
  ``prioritize`` (filter passes every node that fits, prioritize ranks them); and per transport
  (``--transports``): plain HTTP (the default), or mutual TLS as the chart's ``extender.tls`` serves it, with
  ECDSA P-256 or RSA 2048 keys (what cert-manager and kubeadm issue unless told otherwise) for the CA, the
  extender's certificate and the loop's client certificate. kube-scheduler's Go client resumes no TLS session,
  and neither does the loop: every connection it opens is a full handshake, which the extender's CPU a pod and
  the connections opened a pod show. Its /metrics is then scraped on the plain health port, as the chart's
  Prometheus annotations have it.

The API server, the scheduler loop and the extender are three processes, as kube-apiserver, kube-scheduler and
the extender are: with the API server in the loop's process, the loop waited for the GIL while the API server
served binds and watches, and that wait was counted as the extender's time.

Reported per row: pods/s from the loop's start until 99% of the pods were bound (a few pods that fit nowhere
must not set the pace; "bound" says how many were bound in the end), the ratio to the floor of the same run, the
extender's time per pod (filter + prioritize as the loop saw it: median, p99 and the slowest, where a cold start
shows), bind latency p99, the mean time the extender's filter handler took by its own clock (its /metrics
histogram: the rest of the loop's figure is the HTTP round trip and waiting for a core), the extender's CPU
seconds per pod (bind included, from /proc) and its resident memory at the end, its full garbage collections
during the row (each a pause of every request in flight; from its /metrics), and the CPU per pod of the loop's
process and of the API server's, so that what the extender adds to the machine can be read beside what
kube-scheduler and the API server spend. Beside the loop's CPU, the nodes its own checks went through per cycle to
find ``numFeasibleNodesToFind``: a policy that packs pods leaves more nodes full for the next pod's shape, so
kube-scheduler passes over more of them, work the floor (which spreads pods by CPU, as kube-scheduler's default
scoring does) and the null extender (which takes the first name, from a rotating start) do not have.
Last, per pod, the time that the two threads a pod's cycle passes through in turn, the loop's scheduling thread
and the extender's event loop, spent runnable but waiting for a core (the kernel's schedstat): on a machine
whose cores the three processes share, the part of the gap to the floor that is waiting rather than work.
While a policy's row runs, its extender's /metrics is scraped every ``--scrape-interval`` seconds, as Prometheus
would (0: never), so that what a scrape costs the GPU path is in the figures. Progress goes to stderr; the table to
stdout.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import random
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from enum import StrEnum
from itertools import cycle, islice
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families
from tabulate import tabulate

from bench import openb
from bench.replay_http import advertise_in_unit, wait_for_urls
from extender.collector import FULL_COLLECTION_AFTER
from extender.config import NodeChoice
from gpushare.clusterspec import ClusterSpec, GPUSpec, NodeSpec
from gpushare.contract import ANN_GPU_COUNT, ANN_GPU_MODEL, RESOURCE_GPU_MEM, MemoryUnit
from gpushare.kube.api import Kube
from gpushare.kube.client import load_configuration
from gpushare.localcluster import LocalCluster
from gpushare.localcluster.pki import Issued, KeyKind, client_context, issue, make_ca
from gpushare.localcluster.scheduler import SCHEDULING_THREAD, SchedulerLoop
from gpushare.policies import DEFAULT_POLICY, policy_names

NODE_GPUS = 8
GPU_GIB = 16
FLEETS = ("uniform", "openb")
MODEL = "Tesla-V100-SXM2-16GB"
START_TIMEOUT_S = 120.0
# The share of the pods whose binds set a row's rate (see ``run_loop``).
RATE_SHARE = 0.99
# The driver stands in for kube-scheduler, which has no GIL: its scheduling thread must not wait the default 5 ms
# switch interval for the GIL behind its own bind and watch threads, a wait the extender's latency would be charged
# with (measured: the loop-side p99 minus the extender's own answer time fell from 6.0-7.5 ms to 3.0-4.2 ms).
DRIVER_SWITCH_INTERVAL_S = 0.0005


class Transport(StrEnum):
    """How the loop reaches the extender (``--transports``)."""

    HTTP = "http"
    MTLS_ECDSA = "mtls-ecdsa"
    MTLS_RSA = "mtls-rsa"

    @property
    def key(self) -> KeyKind | None:
        return {Transport.MTLS_ECDSA: KeyKind.ECDSA, Transport.MTLS_RSA: KeyKind.RSA}.get(self)

    @property
    def label(self) -> str:
        """What a row's setup says of it; nothing for plain HTTP."""
        keys = {KeyKind.ECDSA: "ECDSA P-256", KeyKind.RSA: "RSA 2048"}
        return "" if self.key is None else f", mutual TLS ({keys[self.key]})"


def parse_transports(value: str) -> list[Transport]:
    """``--transports``, comma-separated; argparse reports what is wrong with it."""
    try:
        return [Transport(t) for t in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a comma-separated list of {', '.join(Transport)}, "
                                         f"not {value!r}") from None


@dataclass(frozen=True)
class MutualTLS:
    """A CA, the extender's serving certificate and the loop's client certificate, as the chart's Secrets hold
    them."""

    ca: Issued
    server: Issued
    scheduler: Issued

    @classmethod
    def make(cls, folder: Path, key: KeyKind) -> MutualTLS:
        folder.mkdir(parents=True, exist_ok=True)
        ca = make_ca(folder, "gpushare-ca", key)
        return cls(ca, issue(ca, folder, "extender", 1, True, key), issue(ca, folder, "kube-scheduler", 2, False, key))

    def extender_flags(self) -> list[str]:
        # The health port stays plain HTTP, as the chart's probes and Prometheus scrape it.
        return ["--tls-cert", str(self.server.cert), "--tls-key", str(self.server.key),
                "--tls-client-ca", str(self.ca.cert), "--health-port", "0"]

    def loop_context(self) -> ssl.SSLContext:
        """kube-scheduler's tlsConfig: trusts the CA, presents its client certificate."""
        return client_context(self.ca, self.scheduler)


# What each pod requests besides its GPUs when ``--host-requests fixed`` (the default).
FIXED_CPU = "1"
FIXED_MEMORY = "2Gi"


@dataclass(frozen=True, slots=True)
class Shape:
    per_gpu: int  # GPU memory per GPU, in the fleet's unit (GiB for the uniform fleet, MiB for openb's)
    gpus: int
    cpu: str = FIXED_CPU
    memory: str = FIXED_MEMORY
    models: str = ""  # the trace pod's model constraint, kept on openb's fleet only


@dataclass(frozen=True, slots=True)
class Row:
    setup: str
    pods_per_s: float
    scheduled: int
    cycle_ms: tuple[float, float, float] | None  # filter + prioritize as the loop measured it: median, p99, slowest
    bind_p99_ms: float | None
    filter_answer_ms: float | None  # the mean time the extender's filter handler took, by its own clock
    cpu_ms_per_pod: float | None
    rss_mib: float | None
    loop_cpu_ms_per_pod: float
    api_cpu_ms_per_pod: float
    nodes_checked: float  # the nodes the loop's own checks went through per cycle, on average
    connections: float | None = None  # connections the loop opened to the extender, per pod
    full_collections: int | None = None  # the extender's full garbage collections while the row ran
    round: int = 1  # which of ``--rounds`` it ran in
    # Time runnable but waiting for a core, per pod, of the two threads a pod's cycle passes through in turn:
    # the loop's scheduling thread and the extender's event loop (None where not measured).
    loop_wait_ms: float | None = None
    extender_wait_ms: float | None = None

    @property
    def is_floor(self) -> bool:
        return self.setup.startswith("floor")


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def trace_shapes(data: Path, trace: str, count: int, seed: int, trace_host_requests: bool = False,
                 fleet: str = "uniform") -> list[Shape]:
    """``count`` GPU shapes drawn from the trace's GPU pods, with replacement, in its proportions; with
    ``trace_host_requests``, each with its trace pod's CPU and memory requests too (many more distinct shapes).
    ``trace``: a name of the family, or a pod list file."""
    pods = [p for p in openb.load_pods(data, trace) if p.num_gpu]
    rng = random.Random(seed)
    shapes = []
    for pod in rng.choices(pods, k=count):
        host = {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"} if trace_host_requests else {}
        if fleet == "openb":  # GPUs of 1000 MiB: the trace's own numbers
            shapes.append(Shape(pod.gpu_milli, pod.num_gpu, models=pod.gpu_spec, **host))
        else:
            fraction = pod.gpu_milli / 1000
            shapes.append(Shape(max(1, round(fraction * GPU_GIB)) if pod.num_gpu == 1 else GPU_GIB, pod.num_gpu,
                                **host))
    return shapes


def cluster(nodes: int, fleet: str, data: Path) -> ClusterSpec:
    if fleet == "openb":
        kinds = openb.load_nodes(data)
        return openb.cluster_spec(replace(kind, name=f"node-{i:05d}")
                                  for i, kind in enumerate(islice(cycle(kinds), nodes)))
    gpus = [GPUSpec.model_validate({"model": MODEL, "memoryMiB": GPU_GIB * 1024, "numa": i // 4})
            for i in range(NODE_GPUS)]
    return ClusterSpec(nodes=[NodeSpec(name=f"node-{i:05d}", cpu="96", memory="768Gi", pods="110", gpus=gpus)
                              for i in range(nodes)])


def manifest(name: str, shape: Shape) -> dict[str, Any]:
    annotations = {ANN_GPU_COUNT: str(shape.gpus)} if shape.gpus > 1 else {}
    if shape.models:
        annotations[ANN_GPU_MODEL] = shape.models
    limits = {RESOURCE_GPU_MEM: str(shape.per_gpu * shape.gpus)}
    requests = {"cpu": shape.cpu, "memory": shape.memory}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations},
            "spec": {"containers": [{"name": "main", "image": "registry.local/task:1",
                                     "resources": {"limits": limits, "requests": requests}}]}}


def create_pods(core: client.CoreV1Api, shapes: Sequence[Shape], prefix: str) -> None:
    create: Any = core.create_namespaced_pod  # the client accepts the manifest as a plain dict, as kubectl sends it
    for i, shape in enumerate(shapes):
        create("default", manifest(f"{prefix}-{i:05d}", shape), _preload_content=False)


def delete_pods(kube: Kube, core: client.CoreV1Api) -> None:
    core.delete_collection_namespaced_pod("default", grace_period_seconds=0, _preload_content=False)
    deadline = time.monotonic() + 120
    while kube.pods.list() and time.monotonic() < deadline:
        time.sleep(0.5)


def bound_count(kube: Kube) -> int:
    return sum(1 for p in kube.pods.list() if (p.get("spec") or {}).get("nodeName"))


def run_loop(api: client.ApiClient, url: str | None, pods: int, seed: int, what: str,
             tls: ssl.SSLContext | None = None) -> tuple[float, int, SchedulerLoop, float | None]:
    """Start the loop over pods that already exist; the seconds until ``RATE_SHARE`` of them were bound, how many
    were bound by then, and the seconds its scheduling thread waited for a core over the whole run.

    A few pods may fit nowhere (kube-scheduler's own scoring spreads pods, so without an extender the whole-node
    pods of a large draw find no empty node) and then bind, if ever, only after retries and backoffs of up to
    10 s: the rate is the pace of the first ``RATE_SHARE``, for every row alike, so that a stall of the last
    few does not set it. After 30 s without a bind the run ends.
    """
    loop = SchedulerLoop(api, url, seed=seed, tls=tls)
    target = math.ceil(RATE_SHARE * pods)
    started = time.perf_counter()
    loop.start()
    scheduling = next(t.native_id for t in threading.enumerate() if t.name == SCHEDULING_THREAD)
    last, last_change, done, reached = -1, started, 0, None
    while True:
        time.sleep(0.05)
        done = loop.bound_pods()
        now = time.perf_counter()
        if reached is None and done >= target:
            reached = (now - started, done)
        if done != last:
            if last // 1000 != done // 1000 or done >= pods:
                progress(f"  {what}: {done}/{pods} bound")
            last, last_change = done, now
        if done >= pods or now - last_change > 30:
            break
    waited = thread_wait_s(os.getpid(), scheduling)
    loop.stop()
    seconds, counted = reached if reached is not None else (last_change - started, done)
    return seconds, counted, loop, waited


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_wait_s(pid: int, tid: int | None) -> float | None:
    """The seconds the thread has spent runnable but waiting for a core (the kernel's schedstat), if it shows them."""
    try:
        return int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def proc_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def extender_figures(url: str) -> tuple[float | None, int]:
    """From the extender's /metrics: the mean of its filter request durations in milliseconds, and how many full
    garbage collections it has made."""
    filter_totals, full = {}, 0
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text):
        for sample in family.samples:
            if family.name == "gpushare_extender_request_duration_seconds" and sample.labels.get("verb") == "filter":
                filter_totals[sample.name] = sample.value
            elif sample.name == "python_gc_collections_total" and sample.labels.get("generation") == "2":
                full = int(sample.value)
    count = filter_totals.get("gpushare_extender_request_duration_seconds_count", 0.0)
    mean_ms = 1000 * filter_totals["gpushare_extender_request_duration_seconds_sum"] / count if count else None
    return mean_ms, full


@contextmanager
def scraping(url: str | None, interval_s: float) -> Iterator[None]:
    """GET ``url`` (a /metrics) every ``interval_s`` seconds in the background, as Prometheus scrapes a target."""
    if url is None or interval_s <= 0:
        yield
        return
    stop = threading.Event()

    def scrape() -> None:
        while not stop.wait(interval_s):
            httpx.get(url, timeout=30)

    scraper = threading.Thread(target=scrape, name="scraper", daemon=True)
    scraper.start()
    try:
        yield
    finally:
        stop.set()
        scraper.join()


def per_pod_ms(seconds: float, pods: int) -> float:
    return 1000 * seconds / max(pods, 1)


@contextmanager
def child(command: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A process of this benchmark's, its output in ``log``; terminated (killed after 15 s) on the way out."""
    with log.open("w") as out:
        process = subprocess.Popen(command, stderr=out, stdout=out)
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def extender(kubeconfig: Path, policy: str, choice: str, seed: int, fleet: str, log: Path,
             tls: MutualTLS | None = None) -> Iterator[tuple[str, str, int]]:
    """The extender as a process, once it has listed the cluster: the URL of its verbs' listener, that of its
    /readyz and /metrics (the same without ``tls``), and its pid."""
    command = [sys.executable, "-m", "extender", "--host", "127.0.0.1", "--port", "0", "--policy", policy,
               "--node-choice", choice, "--tie-seed", str(seed), "--kubeconfig", str(kubeconfig),
               "--unit", (MemoryUnit.MiB if fleet == "openb" else MemoryUnit.GiB).value,
               *(tls.extender_flags() if tls is not None else ())]
    with child(command, log) as process:
        urls = wait_for_urls(process, log, 1 if tls is None else 2)
        url = next(u for u in urls if u.startswith("https://")) if tls is not None else urls[0]
        health = next(u for u in urls if u.startswith("http://"))
        deadline = time.monotonic() + START_TIMEOUT_S
        while httpx.get(health + "/readyz", timeout=5).status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"The extender did not list the cluster within {START_TIMEOUT_S:.0f} s; see {log}.")
            time.sleep(0.2)
        yield url, health, process.pid


@contextmanager
def null_extender(kubeconfig: Path, log: Path) -> Iterator[tuple[str, int]]:
    """``bench.null_extender`` on a free port: its verbs' URL prefix and its pid, once it answers."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "bench.null_extender", "--port", str(port), "--kubeconfig", str(kubeconfig)]
    with child(command, log) as process:
        url = f"http://127.0.0.1:{port}/gpushare-scheduler"
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                httpx.post(url + "/filter", json={"NodeNames": []}, timeout=5)
                break
            except httpx.TransportError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"The null extender did not start: {log.read_text().strip()[-2000:]}") from None
                time.sleep(0.1)
        yield url, process.pid


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextmanager
def full_collections_deferred() -> Iterator[None]:
    """Within: CPython's collector walks every object only after ``FULL_COLLECTION_AFTER`` middle collections, as in
    the extender once it has listed the cluster.

    The loop and the API server stand in for kube-scheduler and kube-apiserver, Go programs whose collector runs
    beside them. Here a full collection walks every object of the process's copy of the cluster, and each row met one
    or two in the loop's process or the API server's, of 100-200 ms each at 5,000 nodes, with the cycle or the
    Bindings stopped meanwhile (round 63, docs/throughput-history.md). Their objects are freed by reference counting
    and hold few cycles, so a run needs none.
    """
    young, middle, full = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_AFTER)
    try:
        yield
    finally:
        gc.set_threshold(young, middle, full)


def serve_cluster(nodes: int, fleet: str, data: Path, kubeconfig: Path) -> None:
    """Child process: the local API server with ``nodes`` nodes of ``fleet`` until SIGTERM; the kubeconfig appears
    once it serves them as the benchmark needs."""
    # Blocked before the server's thread starts, so that it inherits the mask and only sigwait takes them.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    spec = cluster(nodes, fleet, data)
    with full_collections_deferred(), LocalCluster(spec) as local:
        if fleet == "openb":
            advertise_in_unit(client.CoreV1Api(local.api_client()), spec)
        local.write_kubeconfig(kubeconfig.with_suffix(".partial")).rename(kubeconfig)  # whole, or not there yet
        signal.sigwait({signal.SIGTERM, signal.SIGINT})


@contextmanager
def api_server(nodes: int, fleet: str, data: Path, workdir: Path) -> Iterator[tuple[Path, int]]:
    """The local API server as its own process: its kubeconfig and pid."""
    kubeconfig = workdir / f"kubeconfig-{nodes}"
    log = workdir / f"apiserver-{nodes}.log"
    command = [sys.executable, "-m", "bench.bench_throughput", "--serve-cluster", str(nodes), "--fleet", fleet,
               "--data", str(data), "--kubeconfig-out", str(kubeconfig)]
    with child(command, log) as process:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not kubeconfig.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"The local API server did not start within {START_TIMEOUT_S:.0f} s: "
                                   f"{log.read_text().strip()[-2000:]}")
            time.sleep(0.1)
        yield kubeconfig, process.pid


@dataclass(frozen=True, slots=True)
class Run:
    """One pass of the loop over freshly created pods, and the CPU each process spent per pod bound."""

    pods_per_s: float
    bound: int
    loop: SchedulerLoop
    extender_cpu_ms: float | None
    loop_cpu_ms: float
    api_cpu_ms: float
    loop_wait_ms: float | None
    extender_wait_ms: float | None


def measure(nodes: int, fleet: str, data: Path, shapes: Sequence[Shape], runs: Sequence[tuple[str, str, Transport]],
            seed: int, workdir: Path, scrape_interval_s: float, rounds: int = 1) -> list[Row]:
    """The floor, then ``rounds`` times: the null extender, one row per (policy, node choice, transport) of
    ``runs``, the floor again."""
    rows = []
    certificates = {transport: MutualTLS.make(workdir / f"tls-{transport.key}", transport.key)
                    for *_, transport in runs if transport.key is not None}
    progress(f"{nodes} nodes: starting the local API server")
    with api_server(nodes, fleet, data, workdir) as (kubeconfig, api_pid):
        configuration = load_configuration(kubeconfig)
        api = client.ApiClient(configuration)
        core = client.CoreV1Api(api)
        kube = Kube.from_api_client(api)

        def scheduled(prefix: str, what: str, url: str | None, extender_pid: int | None,
                      metrics_url: str | None = None, tls: ssl.SSLContext | None = None) -> Run:
            """Create the pods, let the loop schedule them (through ``url``, if given, scraping ``metrics_url``
            meanwhile), and count."""
            progress(f"{nodes} nodes: {what}, creating {len(shapes)} pods")
            # What the previous rows left that only the collector frees (a loop holds its threads, whose targets are
            # its own methods) goes now, untimed (``full_collections_deferred``).
            gc.collect()
            create_pods(core, shapes, prefix)
            extender_before = proc_cpu_s(extender_pid) if extender_pid is not None else 0.0
            # The extender's event loop is its main thread, whose id is the process's.
            extender_wait_before = thread_wait_s(extender_pid, extender_pid) if extender_pid is not None else None
            loop_before, api_before = time.process_time(), proc_cpu_s(api_pid)
            with scraping(metrics_url, scrape_interval_s):
                seconds, counted, loop, loop_wait_s = run_loop(client.ApiClient(configuration), url, len(shapes),
                                                               seed, what, tls)
            loop_s, api_s = time.process_time() - loop_before, proc_cpu_s(api_pid) - api_before
            extender_s = proc_cpu_s(extender_pid) - extender_before if extender_pid is not None else None
            extender_wait_after = thread_wait_s(extender_pid, extender_pid) if extender_pid is not None else None
            done = bound_count(kube)
            extender_wait_ms = (per_pod_ms(extender_wait_after - extender_wait_before, done)
                                if extender_wait_before is not None and extender_wait_after is not None else None)
            return Run(counted / seconds, done, loop, None if extender_s is None else per_pod_ms(extender_s, done),
                       per_pod_ms(loop_s, done), per_pod_ms(api_s, done),
                       None if loop_wait_s is None else per_pod_ms(loop_wait_s, done), extender_wait_ms)

        def floor(prefix: str, what: str, round_: int) -> Row:
            run = scheduled(prefix, what, None, None)
            delete_pods(kube, core)
            return Row(f"{what}: no extender", run.pods_per_s, run.bound, None, None, None, None, None,
                       run.loop_cpu_ms, run.api_cpu_ms, nodes_checked(run.loop), round=round_,
                       loop_wait_ms=run.loop_wait_ms)

        rows.append(floor("floor", "floor", 1))
        for round_ in range(1, rounds + 1):
            if rounds > 1:
                progress(f"{nodes} nodes: round {round_} of {rounds}")
            with null_extender(kubeconfig, workdir / f"null-extender-{nodes}.log") as (url, pid):
                null = scheduled("null", "the null extender", url, pid)
            rows.append(Row("null extender: HTTP and the Binding only", null.pods_per_s, null.bound,
                            *loop_figures(null.loop), None, null.extender_cpu_ms, None, null.loop_cpu_ms,
                            null.api_cpu_ms, nodes_checked(null.loop), connections(null), round=round_,
                            loop_wait_ms=null.loop_wait_ms, extender_wait_ms=null.extender_wait_ms))
            delete_pods(kube, core)
            for policy, choice, transport in runs:
                what = f"{policy}, chosen in {choice}{transport.label}"
                log = workdir / f"extender-{nodes}-{policy}-{choice}-{transport}.log"
                tls = certificates.get(transport)
                with extender(kubeconfig, policy, choice, seed, fleet, log, tls) as (url, health, pid):
                    _, full_before = extender_figures(health)
                    run = scheduled(f"{policy}-{choice}-{transport}", what, url + "/gpushare-scheduler", pid,
                                    health + "/metrics", tls.loop_context() if tls is not None else None)
                    rss = proc_rss_mib(pid)
                    answered_ms, full_after = extender_figures(health)
                rows.append(Row(what, run.pods_per_s, run.bound, *loop_figures(run.loop), answered_ms,
                                run.extender_cpu_ms, rss, run.loop_cpu_ms, run.api_cpu_ms, nodes_checked(run.loop),
                                connections(run), full_after - full_before, round=round_, loop_wait_ms=run.loop_wait_ms,
                                extender_wait_ms=run.extender_wait_ms))
                delete_pods(kube, core)
            rows.append(floor("floor-again", "floor again", round_))
    return rows


def loop_figures(loop: SchedulerLoop) -> tuple[tuple[float, float, float] | None, float | None]:
    """The extender's time per pod as the loop saw it (median, p99, slowest), and the binds' p99."""
    cycles, binds = loop.stats.extender_ms, loop.stats.bind_ms
    return ((statistics.median(cycles), percentile(cycles, 0.99), max(cycles)) if cycles else None,
            percentile(binds, 0.99) if binds else None)


def nodes_checked(loop: SchedulerLoop) -> float:
    """The nodes the loop's own checks went through per cycle, on average (``LoopStats.nodes_checked``)."""
    checked = loop.stats.nodes_checked
    return statistics.mean(checked) if checked else 0.0


def connections(run: Run) -> float:
    """The connections the loop opened to the extender per pod bound (``SchedulerLoop.extender_connections``)."""
    return run.loop.extender_connections() / max(run.bound, 1)


def ratios(rows: Sequence[Row]) -> list[float]:
    """Each row's pods/s against the floor: for a floor, the mean of every floor; for any other row, the mean of the
    floors just before and after it (``measure`` brackets every round with floors), since the machine's pace drifts
    from minute to minute."""
    floors = [i for i, row in enumerate(rows) if row.is_floor]
    overall = statistics.mean(rows[i].pods_per_s for i in floors)
    out = []
    for i, row in enumerate(rows):
        if row.is_floor:
            out.append(row.pods_per_s / overall)
            continue
        around = [rows[j].pods_per_s for j in (max((j for j in floors if j < i), default=None),
                                              min((j for j in floors if j > i), default=None)) if j is not None]
        out.append(row.pods_per_s / statistics.mean(around) if around else math.nan)
    return out


def table(rows: Sequence[Row]) -> str:
    several = any(row.round > 1 for row in rows)
    body = []
    for i, (row, ratio) in enumerate(zip(rows, ratios(rows), strict=True)):
        cycle = " / ".join(f"{ms:.1f}" for ms in row.cycle_ms) if row.cycle_ms else "-"
        label = f"{row.setup} (round {row.round})" if several and i else row.setup
        body.append([label, f"{row.pods_per_s:.0f}", f"{ratio:.2f}", row.scheduled, cycle,
                     "-" if row.bind_p99_ms is None else f"{row.bind_p99_ms:.1f}",
                     _ms(row.filter_answer_ms), _ms(row.cpu_ms_per_pod),
                     "-" if row.rss_mib is None else f"{row.rss_mib:.0f}",
                     "-" if row.full_collections is None else str(row.full_collections),
                     f"{row.loop_cpu_ms_per_pod:.2f}", f"{row.nodes_checked:.0f}", f"{row.api_cpu_ms_per_pod:.2f}",
                     f"{_ms(row.loop_wait_ms)} / {_ms(row.extender_wait_ms)}",
                     "-" if row.connections is None else f"{row.connections:.2f}"])
    headers = ["setup", "pods/s", "x floor", "bound", "filter+prioritize ms (median / p99 / slowest)", "bind p99 ms",
               "filter handler ms (mean)", "extender CPU ms/pod", "extender RSS MiB", "extender full GCs",
               "loop CPU ms/pod", "loop nodes checked per cycle", "API server CPU ms/pod",
               "waiting for a core ms/pod (loop's cycle / extender's event loop)",
               "connections opened to the extender per pod"]
    return tabulate(body, headers=headers, tablefmt="github")


def _ms(value: float | None) -> str:
    """A figure in milliseconds for the table, to two decimals; "-" where it was not measured."""
    return "-" if value is None else f"{value:.2f}"


def summary(rows: Sequence[Row]) -> str:
    """Per setup other than the floor, over the rounds: the median pods/s and the median, lowest and highest of its
    ratios to the floors around it."""
    by_setup: dict[str, list[tuple[float, float]]] = {}
    for row, ratio in zip(rows, ratios(rows), strict=True):
        if not row.is_floor:
            by_setup.setdefault(row.setup, []).append((row.pods_per_s, ratio))
    body = []
    for setup, runs in by_setup.items():
        paces, ratios_ = [p for p, _ in runs], [r for _, r in runs]
        body.append([setup, len(runs), f"{statistics.median(paces):.0f}", f"{statistics.median(ratios_):.2f}",
                     f"{min(ratios_):.2f}-{max(ratios_):.2f}"])
    return tabulate(body, headers=["setup", "rounds", "pods/s (median)", "x floor (median)", "x floor (range)"],
                    tablefmt="github")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="5000,15000", help="comma-separated cluster sizes")
    parser.add_argument("--pods", type=int, default=10_000, help="pods to schedule per row")
    parser.add_argument("--policies", default="all", help=f"comma-separated, or all ({', '.join(policy_names())})")
    parser.add_argument("--node-choices", default=NodeChoice.FILTER.value,
                        help=f"comma-separated --node-choice values each policy runs with "
                             f"({', '.join(NodeChoice)}; default {NodeChoice.FILTER.value})")
    parser.add_argument("--data", type=Path, default=openb.DEFAULT_DATA, help="the openb folder (pod shapes)")
    parser.add_argument("--trace", default="default",
                        help=f"the openb trace in --data whose GPU pods the shapes are drawn from "
                             f"({', '.join(openb.TRACES)}), or a pod list file of the same columns")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--host-requests", choices=("fixed", "trace"), default="fixed",
                        help=f"each pod's CPU and memory requests: {FIXED_CPU} CPU and {FIXED_MEMORY} (fixed), or its "
                             "trace pod's (trace: 126 distinct shapes in the default trace instead of 24)")
    parser.add_argument("--fleet", choices=FLEETS, default="uniform",
                        help="the nodes: all 8 x 16 GiB (uniform), or openb's node list repeated to the size (openb)")
    parser.add_argument("--scrape-interval", type=float, default=15.0, metavar="SECONDS",
                        help="how often each policy's extender's /metrics is scraped during its row, as Prometheus "
                             "would (0: never)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the null extender's and the policies' rows this many times, each round followed by "
                             "the floor again, and summarise each setup's ratios over the rounds (default 1)")
    parser.add_argument("--transports", type=parse_transports, default=[Transport.HTTP],
                        help=f"comma-separated, how the loop reaches each policy's extender: "
                             f"{', '.join(Transport)} (default {Transport.HTTP.value})")
    parser.add_argument("--serve-cluster", type=int, metavar="NODES", help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_cluster is not None:
        serve_cluster(args.serve_cluster, args.fleet, args.data, args.kubeconfig_out)
        return 0
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, not {args.rounds}.")
    try:
        openb.trace_path(args.data, args.trace)
    except openb.TraceError as exc:
        parser.error(str(exc))
    policies = list(policy_names()) if args.policies == "all" else args.policies.split(",")
    policies.sort(key=lambda p: p != DEFAULT_POLICY)
    runs = [(policy, NodeChoice(choice).value, transport) for policy in policies
            for choice in args.node_choices.split(",") for transport in args.transports]
    sys.setswitchinterval(DRIVER_SWITCH_INTERVAL_S)
    shapes = trace_shapes(args.data, args.trace, args.pods, args.seed, args.host_requests == "trace", args.fleet)
    described = (f"nodes of openb's fleet, repeated ({len(openb.load_nodes(args.data))} nodes)"
                 if args.fleet == "openb" else f"nodes x {NODE_GPUS} GPUs")
    with tempfile.TemporaryDirectory(prefix="gpushare-throughput-") as tmp, full_collections_deferred():
        for nodes in (int(n) for n in args.nodes.split(",")):
            rows = measure(nodes, args.fleet, args.data, shapes, runs, args.seed, Path(tmp), args.scrape_interval,
                           args.rounds)
            print(f"{nodes} {described}, pods of openb's {openb.trace_name(args.trace)} trace\n{table(rows)}",
                  flush=True)
            if args.rounds > 1:
                print(f"\nOver {args.rounds} rounds\n{summary(rows)}", flush=True)
            print(flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
