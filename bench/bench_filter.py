"""What the extender's filter costs by itself, in process: no HTTP, no API server, no other process on the cores.

    .venv/bin/python -m bench.bench_filter [--nodes 5000] [--pods 6000] [--trace gpuspec20] [--policy fgd-scarcity]
                                           [--data ../shared/data/openb] [--seed 42] [--window 500]

The end-to-end rows of ``bench.bench_throughput`` move by a fifth with the machine's pace; this one measures the
same work where little else runs. A ``ClusterCache`` holds ``--nodes`` of openb's nodes (the node list repeated,
as ``--fleet openb`` builds them, every GPU 1000 MiB). For each of ``--pods`` pods drawn from ``--trace`` (their
GPU share, model rule, CPU and memory), ``Verbs.filter`` answers a window of ``--window`` node names, each window
starting where the last one ended, as kube-scheduler's rotating start does when every node is feasible; the GPUs
filter chose there are held and the garbage collection due is made, as the extender does once the answer is out
(the hold's evaluation counted among filter's states, its time and the collection's among the reservations'),
bind's reservation takes the hold over, and the policies catch up, as bind does before its Binding. Two passes over
the same pods, in this process, each choosing in filter (the extender's default: filter passes only the policy's
favourite):

* **binpack**, the baseline: a policy whose evaluation of a node is a few comparisons, so that the pass costs
  what parsing, checking fit, looking up remembered scores and answering cost;
* **``--policy``**, which scores afresh the node states it has no score for under what it has learned.

Reported per pass: the filter's time per pod (mean, median, p99, parsing the request included, and the slowest
filter: a memo emptied at its bound once showed there as 33 ms, and the first filter as 54-83 ms while it copied
every node for the policy to follow, which the extender now does before it is ready), the node
states the policy scored afresh per filter and the mean time of one such evaluation, the reservations' time per pod,
and a hash of the choices (node and GPUs per pod: the same code and inputs give the same hash; a change that must
not move decisions must not move it). The ratio is each pass's mean filter time to the baseline's. A second table
splits each pass into fifths of its pods, in order: the cost of a filter grows as the cluster fills.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import itertools
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson
from kubernetes import client
from prometheus_client import CollectorRegistry
from tabulate import tabulate

from bench import openb
from bench.bench_throughput import cluster, manifest, percentile, trace_shapes
from extender import collector
from extender.gang import Gangs
from extender.placement import PolicyBook, RequestCache
from extender.verbs import Verbs
from extender.wire import parse_extender_args
from gpushare.cache.gangs import GangIndex
from gpushare.cache.state import ClusterCache, ReservationError
from gpushare.contract import ANN_MEMORY_UNIT, RESOURCE_GPU_MEM, MemoryUnit, PodRequest, parse_request
from gpushare.kube.api import PodGroups
from gpushare.kube.convert import node_info
from gpushare.localcluster.nodes import node_object
from gpushare.model import Node
from gpushare.policies import DEFAULT_POLICY, Candidate, Policy, policy_names

# The baseline pass's policy: its evaluation of a node is a few comparisons.
BASELINE = "binpack"
# The stretches of a run the second table splits each pass's filters into.
STRETCHES = 5


class CountingBook(PolicyBook):
    """The extender's policy book, counting the policy's evaluations of a node state and the time they take."""

    def __init__(self, default: str) -> None:
        super().__init__(default)
        self.evaluations = 0
        self.seconds = 0.0

    def evaluate(self, policy: Policy, node: Node, request: PodRequest) -> Candidate | None:
        started = time.perf_counter()
        try:
            return super().evaluate(policy, node, request)
        finally:
            self.seconds += time.perf_counter() - started
            self.evaluations += 1


@dataclass(frozen=True, slots=True)
class Pass:
    setup: str
    filter_ms: list[float]
    reserve_ms: float
    evaluations: list[int]
    """Per pod, the node states its filter scored afresh."""
    evaluation_s: float
    unplaced: int
    choices: str


def cluster_cache(nodes: int, data: Path) -> ClusterCache:
    """openb's fleet of ``nodes`` nodes as the extender's watch would fill its cache, with every GPU in MiB."""
    spec = cluster(nodes, "openb", data)
    infos = []
    for ordinal, node in enumerate(spec.nodes):
        obj = node_object(node, ordinal, publish_inventory=True)
        if node.gpus:  # advertised in MiB, as a device plugin running with --unit MiB does
            memory = str(sum(g.memory_mib for g in node.gpus))
            obj["status"]["capacity"][RESOURCE_GPU_MEM] = obj["status"]["allocatable"][RESOURCE_GPU_MEM] = memory
            obj["metadata"]["annotations"][ANN_MEMORY_UNIT] = MemoryUnit.MiB.value
        infos.append(node_info(obj))
    cache = ClusterCache(MemoryUnit.MiB, tie_seed=42)
    cache.replace_nodes(infos)
    cache.replace_pods([])
    return cache


def run_pass(policy: str, nodes: int, bodies: Sequence[bytes], data: Path) -> Pass:
    cache = cluster_cache(nodes, data)
    book = CountingBook(policy)
    requests = RequestCache()
    gangs = Gangs(cache, GangIndex(), requests, book, PodGroups(client.ApiClient()), lambda *_: None,
                  CollectorRegistry())
    verbs = Verbs(cache, book, requests, gangs, choose_in_filter=True)
    # As the extender does once its first list is in: the policy shown the cluster, the cache's objects out of the
    # collector's way.
    verbs.show_cluster()
    thresholds = gc.get_threshold()
    collector.freeze()
    filter_ms, evaluations, reserve_s, unplaced = [], [], 0.0, 0
    choices = hashlib.sha256()
    for done, body in enumerate(bodies, 1):
        evaluated = book.evaluations
        started = time.perf_counter()
        args = parse_extender_args(body)
        filtered = verbs.filter(args)
        filter_ms.append(1000 * (time.perf_counter() - started))
        started = time.perf_counter()
        if filtered.hold is not None:  # as the extender makes it, once the answer is out
            filtered.hold()
        collector.collect_due()  # likewise
        evaluations.append(book.evaluations - evaluated)
        passed = filtered.answer["NodeNames"] or []
        placed = None
        if passed:
            request = cache.resolve(parse_request(args.pod))
            chosen = book.for_request(request)

            def gpus(node: Node, chosen: Policy = chosen, request: PodRequest = request) -> tuple[int, ...] | None:
                # The uncounted evaluation: only filter's are counted.
                candidate = PolicyBook.evaluate(book, chosen, node, request)
                return None if candidate is None else candidate.gpus

            try:
                # What filter held for the pod, as bind takes it over; else reserved as bind reserves.
                reservation = (cache.take_filter_hold(args.pod.key, args.pod.uid, passed[0], request)
                               or cache.reserve(passed[0], args.pod.key, args.pod.uid, request, gpus))
                verbs.catch_up()
                placed = (passed[0], reservation.placement.gpu_indices)
            except ReservationError:
                pass
        reserve_s += time.perf_counter() - started
        unplaced += placed is None
        choices.update(repr(placed).encode())
        if done % 1000 == 0:
            print(f"  {policy}: {done}/{len(bodies)} pods", file=sys.stderr, flush=True)
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    return Pass(policy, filter_ms, 1000 * reserve_s / len(bodies), evaluations, book.seconds, unplaced,
                choices.hexdigest()[:12])


def request_bodies(nodes: list[str], pods: int, trace: str, seed: int, window: int, data: Path) -> list[bytes]:
    """ExtenderArgs as kube-scheduler sends them (nodeCacheCapable), each window after the last one."""
    shapes = trace_shapes(data, trace, pods, seed, trace_host_requests=True, fleet="openb")
    size = min(window, len(nodes))
    bodies = []
    for i, shape in enumerate(shapes):
        pod = manifest(f"pod-{i:05d}", shape)
        pod["metadata"].update(uid=f"uid-{i:05d}", resourceVersion="1")
        start = i * size % len(nodes)
        names = (nodes[start:] + nodes[:start])[:size]
        bodies.append(orjson.dumps({"Pod": pod, "NodeNames": names}))
    return bodies


def table(passes: Sequence[Pass]) -> str:
    base = statistics.mean(passes[0].filter_ms)
    rows = []
    for run in passes:
        count = len(run.filter_ms)
        mean = statistics.mean(run.filter_ms)
        evaluations = sum(run.evaluations)
        rows.append([run.setup, f"{mean:.3f}", f"{statistics.median(run.filter_ms):.3f}",
                     f"{percentile(run.filter_ms, 0.99):.3f}", f"{max(run.filter_ms, default=0.0):.1f}",
                     f"{mean / base:.2f}",
                     f"{evaluations / count:.1f}",
                     "-" if not evaluations else f"{1e6 * run.evaluation_s / evaluations:.1f}",
                     f"{run.reserve_ms:.3f}", run.unplaced, run.choices])
    return tabulate(rows, headers=["policy", "filter ms (mean)", "median", "p99", "slowest",
                                   f"x {passes[0].setup}",
                                   "states scored afresh per filter", "us per evaluation", "reserve ms per pod",
                                   "unplaced", "choices"], tablefmt="github")


def by_stretch(passes: Sequence[Pass]) -> str:
    """Each pass's filters in ``STRETCHES`` stretches of the run, in order: as the cluster fills, its nodes' states grow
    apart and a window holds more of them, so a shape new to the policy scores more states afresh (a mean over the
    whole run hides it)."""
    rows = []
    for run in passes:
        count = len(run.filter_ms)
        bounds = [count * part // STRETCHES for part in range(STRETCHES + 1)]
        for first, end in itertools.pairwise(bounds):
            if first == end:
                continue
            stretch = run.filter_ms[first:end]
            rows.append([run.setup, f"{first + 1}-{end}", f"{statistics.mean(stretch):.3f}",
                         f"{percentile(stretch, 0.99):.3f}", f"{statistics.mean(run.evaluations[first:end]):.2f}"])
    return tabulate(rows, headers=["policy", "pods", "filter ms (mean)", "p99", "states scored afresh per filter"],
                    tablefmt="github")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=6000)
    parser.add_argument("--trace", default="gpuspec20",
                        help=f"the openb trace the pods are drawn from ({', '.join(openb.TRACES)}), or a pod list file")
    parser.add_argument("--policy", default=DEFAULT_POLICY, choices=policy_names())
    parser.add_argument("--data", type=Path, default=openb.DEFAULT_DATA, help="the openb folder")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--window", type=int, default=500, help="node names per filter request")
    args = parser.parse_args(argv)
    try:
        openb.trace_path(args.data, args.trace)
    except openb.TraceError as exc:
        parser.error(str(exc))
    names = [node.name for node in cluster(args.nodes, "openb", args.data).nodes]
    bodies = request_bodies(names, args.pods, args.trace, args.seed, args.window, args.data)
    passes = [run_pass(policy, args.nodes, bodies, args.data) for policy in (BASELINE, args.policy)]
    print(f"{args.nodes} of openb's nodes, {args.pods} pods of openb's {openb.trace_name(args.trace)} trace, "
          f"windows of {min(args.window, args.nodes)} names\n{table(passes)}\n\n"
          f"The same filters by stretches of the run, as the pods bound grow:\n{by_stretch(passes)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
