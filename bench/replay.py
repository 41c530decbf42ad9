"""Replay the openb production trace through gpushare's placement policies (the paper's protocol).

    python -m bench.replay [--trace default|gpuspec10|multigpu20] [--policies binpack,fgd,...]
                           [--seeds 42-51] [--jobs N] [--data DIR] [--out FILE.json] [--plot FILE.png]

Progress goes to stderr, one step per replay; the table to stdout. The plot is drawn only with ``--plot``
(``--plot docs/img/unallocated_vs_arrival.png`` refreshes the README's figure, for the default trace).

For each seed: the pods are sorted by name, shuffled with the seed and extended to 1.3x the cluster's GPU
capacity (``bench.openb.arrival_order``); each pod is placed where ``choose_node`` would put it with the
policy the extender runs (ties broken by ``node_priority(name, seed)``), never retried, never removed. CPU
and memory are hard limits; ``gpu_spec`` is a model constraint. Every pod is shown to ``policy.observe``
first, as the extender does. Policies that learn the workload start seeded with the trace's shape histogram.

Reported per policy (mean and sd over the seeds): unallocated GPU% when the arrived GPU demand reaches 100%
and 130% of capacity; the fragmentation ratio at 80% arrival (expected share of idle GPU memory that a task
drawn from the trace's target workload could not use); run time per replay. Data: Alibaba Cluster Trace
Program, cluster-trace-gpu-v2023 (CC BY 4.0).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from tabulate import tabulate

from bench import openb
from bench.baselines import PaperBestFit
from bench.engine import GroupedCluster
from gpushare.contract import PodRequest
from gpushare.model import Node, gpu_capacity
from gpushare.policies import DEFAULT_POLICY, Policy, make_policy, policy_names
from gpushare.policies.base import follows_cluster, follows_inventory
from gpushare.policies.fgd import FragmentationGradient
from gpushare.policies.workload import WorkloadDistribution, count_shapes

DEFAULT_OUT = openb.REPO_ROOT / "bench" / "out"
REPORT_ARRIVALS = (100.0, 130.0)
# Every policy is compared seed by seed with these two: the paper's method and the simplest packer.
BASELINES = ("fgd", "binpack")
FRAGMENTATION_ARRIVAL = 80.0
CURVE_STEP = 0.5  # arrival% between the points of the recorded curve
# Baselines for comparison only (``--policies bestfit``); the default runs gpushare's policies.
BENCH_POLICIES = {"bestfit": PaperBestFit}
# Policies that start from the trace's own shape histogram: the paper's FGD computes its target from the trace.
SEEDED_POLICIES = frozenset({"fgd"})
# What a replay runs unless told otherwise: the two baselines and the extender's default.
SUITE_POLICIES = tuple(dict.fromkeys(("binpack", "fgd", DEFAULT_POLICY)))


@dataclass(frozen=True, slots=True)
class Decision:
    """Where one pod went: ``node`` is None when no node could take it."""

    pod: str
    node: str | None
    gpus: tuple[int, ...]


@dataclass
class RunResult:
    policy: str
    seed: int
    pods: int
    unallocated: dict[str, float]
    fragmentation_ratio: float
    seconds: float
    evaluations: int
    curve: list[float] = field(default_factory=list)
    trace: str = "default"
    cpu_seconds: float = 0.0  # CPU time of the replay: unlike ``seconds``, it does not grow with others' load


def workload_for(trace_pods: Sequence[openb.TracePod]) -> WorkloadDistribution:
    """A workload distribution seeded with the trace's own shape histogram (the paper's target)."""
    workload = WorkloadDistribution()
    workload.seed(count_shapes(p.request() for p in trace_pods), observations=len(trace_pods))
    return workload


def build_policy(name: str, trace_pods: Sequence[openb.TracePod], nodes: Sequence[Node]) -> Policy:
    """The policy as the extender would run it on this cluster: it knows the cluster's GPU capacity per
    model; only ``fgd`` (the paper's reproduction) starts from the trace's shape histogram, as the paper's
    simulator does, every other learning policy learns online from the pods it sees."""
    if name in BENCH_POLICIES:
        return BENCH_POLICIES[name]()
    policy = make_policy(name, workload=workload_for(trace_pods) if name in SEEDED_POLICIES else None)
    if follows_inventory(policy):
        policy.observe_inventory(gpu_capacity(nodes))
    return policy


def replay(nodes: list[Node], pods: Sequence[openb.TracePod], policy: Policy, seed: int, *,
           shown_as_by_kube_scheduler: bool = False) -> Iterator[Decision]:
    """Place the pods one by one, as the extender would, and yield each decision; ``nodes`` are updated.

    Every pod is shown to the policy, which learns the workload from it; with ``shown_as_by_kube_scheduler``,
    only the pods kube-scheduler would ask the extender about (``kube_scheduler_asks``), as over HTTP.
    """
    return decide(GroupedCluster(nodes, policy, seed), pods, shown_as_by_kube_scheduler)


def kube_scheduler_asks(nodes: Sequence[Node], request: PodRequest) -> bool:
    """Whether kube-scheduler's own checks pass some node, so that it calls the extender for the pod at all.

    It counts CPU, memory and ``aliyun.com/gpu-mem`` per node (the GPU memory of all the node's GPUs together,
    not per GPU); a pod no node passes is unschedulable before any extender hears of it.
    """
    return any(n.fits_host_resources(request) and sum(g.free for g in n.gpus) >= request.total for n in nodes)


def decide(cluster: GroupedCluster, pods: Sequence[openb.TracePod],
           shown_as_by_kube_scheduler: bool = False) -> Iterator[Decision]:
    policy, nodes = cluster.policy, cluster.nodes
    # A policy that weighs what the cluster has left sees every node once, then each node a pod changed.
    watcher = policy if follows_cluster(policy) else None
    if watcher is not None:
        watcher.observe_nodes(nodes)
    for pod in pods:
        request = pod.request()
        if not shown_as_by_kube_scheduler or kube_scheduler_asks(nodes, request):
            policy.observe(request)
        choice = cluster.choose(request)
        if choice is None:
            yield Decision(pod.name, None, ())
            continue
        index, candidate = choice
        cluster.place(index, pod.name, request, candidate.gpus)
        if watcher is not None:
            watcher.observe_nodes((nodes[index],))
        yield Decision(pod.name, nodes[index].name, candidate.gpus)


def fragmentation_ratio(nodes: Sequence[Node], meter: FragmentationGradient) -> float:
    """Fragmented idle GPU memory over all idle GPU memory, against the meter's target workload."""
    idle = sum(g.free for n in nodes for g in n.gpus)
    covered = sum(p for _, p in meter.workload.target)
    if not idle or not covered:
        return 0.0
    return sum(meter.fragmentation(n) for n in nodes) / covered / idle


@functools.lru_cache(maxsize=4)
def _inputs(data_dir: Path, trace: str) -> tuple[list[openb.TraceNode], list[openb.TracePod]]:
    """The trace's nodes and pods, read once per worker process (a suite runs many replays per trace)."""
    return openb.load_nodes(data_dir), openb.load_pods(data_dir, trace)


def run_one(data_dir: Path, trace: str, policy_name: str, seed: int) -> RunResult:
    """One replay of one trace (a name in ``openb.TRACES`` or a pod list file) with one policy and seed."""
    trace_nodes, trace_pods = _inputs(data_dir, trace)
    capacity = openb.capacity(trace_nodes)
    order = openb.arrival_order(trace_pods, seed, capacity)
    nodes = openb.build_nodes(trace_nodes)
    policy = build_policy(policy_name, trace_pods, nodes)
    meter = FragmentationGradient(workload_for(trace_pods))
    demand = {p.name: p.gpu_demand for p in order}
    thresholds = sorted({*REPORT_ARRIVALS, FRAGMENTATION_ARRIVAL})
    unallocated: dict[str, float] = {}
    curve = [100.0]
    ratio = 0.0
    arrived = allocated = 0
    started, cpu_started = time.perf_counter(), time.process_time()
    cluster = GroupedCluster(nodes, policy, seed)
    for decision in decide(cluster, order):
        arrived += demand[decision.pod]
        if decision.node is not None:
            allocated += demand[decision.pod]
        arrival = arrived / capacity * 100
        left = 100 - allocated / capacity * 100
        while len(curve) * CURVE_STEP <= arrival:
            curve.append(left)
        while thresholds and arrival >= thresholds[0]:
            reached = thresholds.pop(0)
            if reached == FRAGMENTATION_ARRIVAL:
                ratio = fragmentation_ratio(nodes, meter)
            if reached in REPORT_ARRIVALS:
                unallocated[f"{reached:g}"] = left
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    for reached in thresholds:
        unallocated.setdefault(f"{reached:g}", 100 - allocated / capacity * 100)
    return RunResult(policy_name, seed, len(order), unallocated, ratio, seconds, cluster.evaluations, curve,
                     openb.trace_name(trace), cpu_seconds)


def run_all(data_dir: Path, traces: Sequence[str], policies: Sequence[str], seeds: Sequence[int],
            jobs: int) -> list[RunResult]:
    """Every trace x policy x seed replay, in that order, with a progress bar on stderr (a suite takes
    minutes)."""
    tasks = [(trace, name, seed) for trace in traces for name in policies for seed in seeds]
    label = openb.trace_name(traces[0]) if len(traces) == 1 else f"{len(traces)} traces"
    # A line per finished replay as well as the bar: a log file or CI gets no bar, only the lines.
    with Progress(console=Console(stderr=True)) as progress:
        bar = progress.add_task(f"{len(tasks)} replays of {label}", total=len(tasks))

        def done(result: RunResult) -> RunResult:
            progress.console.print(f"{result.trace} {result.policy} seed {result.seed}: {result.seconds:.1f} s")
            progress.advance(bar)
            return result

        if jobs <= 1:
            return [done(run_one(data_dir, *task)) for task in tasks]
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures = {task: pool.submit(run_one, data_dir, *task) for task in tasks}
            for future in as_completed(futures.values()):
                done(future.result())
            return [futures[task].result() for task in tasks]


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarize(results: Sequence[RunResult], policies: Sequence[str]) -> list[dict[str, object]]:
    """Per policy over the seeds of one trace: mean and sd of each metric, and the paired comparisons with
    ``fgd`` and ``binpack`` (where they ran)."""
    rows: list[dict[str, object]] = []
    for name in policies:
        runs = [r for r in results if r.policy == name]
        row: dict[str, object] = {"policy": name, "seeds": len(runs)}
        for arrival in REPORT_ARRIVALS:
            mean, sd = _mean_sd([r.unallocated[f"{arrival:g}"] for r in runs])
            row[f"unallocated_{arrival:g}"] = {"mean": mean, "sd": sd}
        mean, sd = _mean_sd([r.fragmentation_ratio for r in runs])
        row["fragmentation_ratio_80"] = {"mean": mean, "sd": sd}
        row["seconds_per_run"] = statistics.fmean(r.seconds for r in runs)
        for baseline in BASELINES:
            for arrival in REPORT_ARRIVALS:
                comparison = paired(results, name, baseline, arrival) if name != baseline else None
                if comparison is not None:
                    row[f"vs_{baseline}_{arrival:g}"] = comparison
        rows.append(row)
    return rows


def paired(results: Sequence[RunResult], policy: str, baseline: str,
           arrival: float = 100.0) -> dict[str, float] | None:
    """How ``policy`` compares with ``baseline`` seed by seed (negative = better)."""
    key = f"{arrival:g}"
    base = {r.seed: r.unallocated[key] for r in results if r.policy == baseline}
    diffs = [r.unallocated[key] - base[r.seed] for r in results if r.policy == policy and r.seed in base]
    if not diffs:
        return None
    return {"mean_difference": statistics.fmean(diffs), "better_seeds": sum(d < 0 for d in diffs),
            "worse_seeds": sum(d > 0 for d in diffs), "seeds": len(diffs)}


def _cell(value: object) -> str:
    assert isinstance(value, dict)
    return f"{value['mean']:.2f} ± {value['sd']:.2f}"


def _versus(row: dict[str, object], key: str) -> str:
    comparison = row.get(key)
    if not isinstance(comparison, dict):
        return ""
    return f"{comparison['mean_difference']:+.2f} ({comparison['better_seeds']}/{comparison['seeds']} better)"


def table(rows: Sequence[dict[str, object]]) -> str:
    body = [[r["policy"], _cell(r["unallocated_100"]), _cell(r["unallocated_130"]),
             *(_versus(r, f"vs_{b}_{a:g}") for b in BASELINES for a in REPORT_ARRIVALS),
             _cell(r["fragmentation_ratio_80"]), f"{r['seconds_per_run']:.1f}"] for r in rows]
    headers = ["policy", "unallocated GPU% @100% arrival", "@130% arrival",
               *(f"vs {b} @{a:g}%" for b in BASELINES for a in REPORT_ARRIVALS), "frag. ratio @80%", "s/run"]
    return tabulate(body, headers=headers, tablefmt="github")


def published_figures(data_dir: Path) -> dict[str, dict[str, float]]:
    """The published unallocated GPU% at 100% arrival per trace and policy, from the data folder's README:
    a table with a ``trace`` column gives one row per trace; a table without one is the default trace's.
    Empty when there is no README."""
    try:
        lines = (Path(data_dir) / "README.md").read_text().splitlines()
    except OSError:
        return {}
    figures: dict[str, dict[str, float]] = {}
    headers: list[str] = []
    for line in lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if not cells:
            headers = []
        elif not headers:
            headers = cells
        elif not set(cells[0]) <= set("-: "):
            named = headers[0].lower() == "trace"
            trace = cells[0] if named else "default"
            for header, cell in zip(headers[1:] if named else headers, cells[1:] if named else cells,
                                    strict=False):
                try:
                    figures.setdefault(trace, {})[header] = float(cell)
                except ValueError:
                    break  # not a table of figures
    return figures


def suite_table(by_trace: dict[str, list[dict[str, object]]], policies: Sequence[str],
                published: dict[str, dict[str, float]]) -> str:
    """One row per policy across traces: the mean over traces of each trace's mean, the seeds better than
    ``fgd`` and ``binpack`` in all, and on how many traces its mean at 100% is at most both of theirs."""
    body = []
    for name in policies:
        rows = [next(r for r in rows if r["policy"] == name) for rows in by_trace.values()]
        means = {a: statistics.fmean(_mean(r, f"unallocated_{a:g}") for r in rows) for a in REPORT_ARRIVALS}
        counts = []
        for baseline in BASELINES:
            found = [r[f"vs_{baseline}_100"] for r in rows if isinstance(r.get(f"vs_{baseline}_100"), dict)]
            counts.append(f"{sum(c['better_seeds'] for c in found)}/{sum(c['seeds'] for c in found)}"  # type: ignore[index]
                          if found else "")
        best = sum(all(_mean(r, "unallocated_100") <= _mean(other, "unallocated_100")
                       for other in trace_rows if other["policy"] in BASELINES)
                   for r, trace_rows in zip(rows, by_trace.values(), strict=True))
        body.append([name, f"{means[100.0]:.2f}", f"{means[130.0]:.2f}", *counts, f"{best}/{len(rows)}"])
    fgd = [published[t]["FGD"] for t in by_trace if "FGD" in published.get(t, {})]
    headers = ["policy", "mean unallocated @100% over traces", "@130%",
               *(f"seeds better than {b} @100%" for b in BASELINES), f"traces <= {' and '.join(BASELINES)}"]
    text = tabulate(body, headers=headers, tablefmt="github")
    if fgd:
        text += f"\npublished FGD, mean over the {len(fgd)} traces that have it: {statistics.fmean(fgd):.2f}"
    return text


def _mean(row: dict[str, object], key: str) -> float:
    value = row[key]
    assert isinstance(value, dict)
    return float(value["mean"])


def plot(results: Sequence[RunResult], policies: Sequence[str], trace: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (full, zoom) = plt.subplots(1, 2, figsize=(10, 4), dpi=100)
    seeds = len({r.seed for r in results})
    for name in policies:
        curves = [r.curve for r in results if r.policy == name]
        length = min(len(c) for c in curves)
        xs = [i * CURVE_STEP for i in range(length)]
        ys = [statistics.fmean(c[i] for c in curves) for i in range(length)]
        for axes in (full, zoom):
            axes.plot(xs, ys, label=name, linewidth=1.6)
    full.set_xlim(60, 130)
    full.set_ylim(0, 40)
    full.set_title(f"openb {trace} trace, mean of {seeds} seeds")
    zoom.set_xlim(90, 130)
    zoom.set_ylim(0, 10)
    zoom.set_title("detail: 90-130% arrival")
    for axes in (full, zoom):
        axes.set_xlabel("arrived GPU demand (% of cluster GPU capacity)")
        axes.set_ylabel("unallocated GPU (%)")
        axes.grid(True, alpha=0.3)
    full.legend()
    figure.text(0.99, 0.01, "Data: Alibaba cluster-trace-gpu-v2023 (CC BY 4.0)", ha="right", fontsize=6,
                color="gray")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)


def _seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds.extend(range(int(low), int(high or low) + 1))
    return seeds


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=openb.DEFAULT_DATA, help="folder with the openb CSV files")
    parser.add_argument("--trace", action="append", choices=sorted(openb.TRACES), default=[],
                        help="a trace of the data folder by name (repeatable; default: default)")
    parser.add_argument("--pods", action="append", type=Path, default=[],
                        help="a pod list CSV in openb's columns, on the data folder's nodes (repeatable)")
    parser.add_argument("--suite", choices=["shared"], help="shared: all nine traces of the data folder")
    parser.add_argument("--policies", default=",".join(SUITE_POLICIES),
                        help=f"comma-separated policy names (default {','.join(SUITE_POLICIES)}; "
                        f"all: {','.join((*policy_names(), *BENCH_POLICIES))})")
    parser.add_argument("--seeds", type=_seeds, default=list(openb.SEEDS), help="e.g. 42-51 or 42,43")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel replays")
    parser.add_argument("--out", type=Path, help="JSON results (default bench/out/replay_<trace or suite>.json)")
    parser.add_argument("--plot", type=Path, help="also draw unallocated GPU%% against arrival into this PNG, for "
                        "the default trace if it ran, else the first (docs/img/unallocated_vs_arrival.png is the "
                        "README's)")
    args = parser.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    known = (*policy_names(), *BENCH_POLICIES)
    unknown = [p for p in policies if p not in known]
    if unknown:
        parser.error(f"unknown policies {', '.join(unknown)}; choose from {', '.join(known)}")
    traces = [*args.trace, *(str(p) for p in args.pods), *(openb.TRACES if args.suite else ())]
    traces = list(dict.fromkeys(traces or ["default"]))
    try:
        openb.load_nodes(args.data)
        for trace in traces:
            openb.load_pods(args.data, trace)
    except openb.TraceError as exc:
        print(exc, file=sys.stderr)
        return 2
    started = time.perf_counter()
    results = run_all(args.data, traces, policies, args.seeds, args.jobs)
    wall = time.perf_counter() - started
    published = published_figures(args.data)
    by_trace: dict[str, list[dict[str, object]]] = {}
    for trace in traces:
        name = openb.trace_name(trace)
        rows = by_trace[name] = summarize([r for r in results if r.trace == name], policies)
        print(f"\n## {name}\n\n{table(rows)}")
        if name in published:
            print("published: " + ", ".join(f"{k} {v:.2f}" for k, v in published[name].items()))
    if len(traces) > 1:
        print(f"\n## all {len(traces)} traces\n\n{suite_table(by_trace, policies, published)}")
    cpu = sum(r.cpu_seconds for r in results)
    print(f"\n{len(results)} replays of {len(traces)} trace(s) in {wall:.0f} s wall time with {args.jobs} jobs "
          f"({cpu:.0f} s of CPU in the replays)")
    label = openb.trace_name(traces[0]) if len(traces) == 1 else "suite"
    out = args.out or DEFAULT_OUT / f"replay_{label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"traces": list(by_trace), "seeds": args.seeds, "wall_seconds": wall, "cpu_seconds": cpu,
                               "summary": by_trace, "published": published,
                               "runs": [asdict(r) for r in results]}, indent=1))
    print(f"results: {out}")
    if args.plot:
        shown = "default" if "default" in by_trace else next(iter(by_trace))
        plot([r for r in results if r.trace == shown], policies, shown, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
