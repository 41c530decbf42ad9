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
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from tabulate import tabulate

from bench import openb
from bench.baselines import PaperBestFit
from bench.engine import GroupedCluster
from gpushare.model import Node
from gpushare.policies import Policy, make_policy, policy_names
from gpushare.policies.fgd import FragmentationGradient
from gpushare.policies.workload import WorkloadDistribution, count_shapes

DEFAULT_OUT = openb.REPO_ROOT / "bench" / "out"
REPORT_ARRIVALS = (100.0, 130.0)
FRAGMENTATION_ARRIVAL = 80.0
CURVE_STEP = 0.5  # arrival% between the points of the recorded curve
# Baselines for comparison only (``--policies bestfit``); the default runs gpushare's policies.
BENCH_POLICIES = {"bestfit": PaperBestFit}


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


def workload_for(trace_pods: Sequence[openb.TracePod]) -> WorkloadDistribution:
    """A workload distribution seeded with the trace's own shape histogram (the paper's target)."""
    workload = WorkloadDistribution()
    workload.seed(count_shapes(p.request() for p in trace_pods), observations=len(trace_pods))
    return workload


def build_policy(name: str, trace_pods: Sequence[openb.TracePod]) -> Policy:
    if name in BENCH_POLICIES:
        return BENCH_POLICIES[name]()
    return make_policy(name, workload=workload_for(trace_pods))


def replay(nodes: list[Node], pods: Sequence[openb.TracePod], policy: Policy, seed: int) -> Iterator[Decision]:
    """Place the pods one by one, as the extender would, and yield each decision; ``nodes`` are updated."""
    return decide(GroupedCluster(nodes, policy, seed), pods)


def decide(cluster: GroupedCluster, pods: Sequence[openb.TracePod]) -> Iterator[Decision]:
    policy, nodes = cluster.policy, cluster.nodes
    for pod in pods:
        request = pod.request()
        policy.observe(request)
        choice = cluster.choose(request)
        if choice is None:
            yield Decision(pod.name, None, ())
            continue
        index, candidate = choice
        cluster.place(index, pod.name, request, candidate.gpus)
        yield Decision(pod.name, nodes[index].name, candidate.gpus)


def fragmentation_ratio(nodes: Sequence[Node], meter: FragmentationGradient) -> float:
    """Fragmented idle GPU memory over all idle GPU memory, against the meter's target workload."""
    idle = sum(g.free for n in nodes for g in n.gpus)
    covered = sum(p for _, p in meter.workload.target)
    if not idle or not covered:
        return 0.0
    return sum(meter.fragmentation(n) for n in nodes) / covered / idle


def run_one(data_dir: Path, trace: str, policy_name: str, seed: int) -> RunResult:
    """One replay of one trace with one policy and one seed."""
    trace_nodes = openb.load_nodes(data_dir)
    trace_pods = openb.load_pods(data_dir, trace)
    capacity = openb.capacity(trace_nodes)
    order = openb.arrival_order(trace_pods, seed, capacity)
    nodes = openb.build_nodes(trace_nodes)
    policy = build_policy(policy_name, trace_pods)
    meter = FragmentationGradient(workload_for(trace_pods))
    demand = {p.name: p.gpu_demand for p in order}
    thresholds = sorted({*REPORT_ARRIVALS, FRAGMENTATION_ARRIVAL})
    unallocated: dict[str, float] = {}
    curve = [100.0]
    ratio = 0.0
    arrived = allocated = 0
    started = time.perf_counter()
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
    seconds = time.perf_counter() - started
    for reached in thresholds:
        unallocated.setdefault(f"{reached:g}", 100 - allocated / capacity * 100)
    return RunResult(policy_name, seed, len(order), unallocated, ratio, seconds, cluster.evaluations, curve)


def run_all(data_dir: Path, trace: str, policies: Sequence[str], seeds: Sequence[int], jobs: int) -> list[RunResult]:
    """Every policy x seed replay, in that order, with a progress bar on stderr (a full run takes minutes)."""
    tasks = [(name, seed) for name in policies for seed in seeds]
    # A line per finished replay as well as the bar: a log file or CI gets no bar, only the lines.
    with Progress(console=Console(stderr=True)) as progress:
        bar = progress.add_task(f"{len(tasks)} replays of the {trace} trace", total=len(tasks))

        def done(result: RunResult) -> RunResult:
            progress.console.print(f"{result.policy} seed {result.seed}: {result.seconds:.1f} s")
            progress.advance(bar)
            return result

        if jobs <= 1:
            return [done(run_one(data_dir, trace, name, seed)) for name, seed in tasks]
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futures: list[Future[RunResult]] = [pool.submit(run_one, data_dir, trace, name, seed)
                                                for name, seed in tasks]
            for future in as_completed(futures):
                done(future.result())
            return [f.result() for f in futures]


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarize(results: Sequence[RunResult], policies: Sequence[str]) -> list[dict[str, object]]:
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
        rows.append(row)
    return rows


def paired(results: Sequence[RunResult], policy: str, baseline: str) -> dict[str, float] | None:
    """How ``policy`` compares with ``baseline`` seed by seed at 100% arrival (negative = better)."""
    base = {r.seed: r.unallocated["100"] for r in results if r.policy == baseline}
    diffs = [r.unallocated["100"] - base[r.seed] for r in results if r.policy == policy and r.seed in base]
    if not diffs:
        return None
    return {"mean_difference": statistics.fmean(diffs), "better_seeds": sum(d < 0 for d in diffs),
            "worse_seeds": sum(d > 0 for d in diffs), "seeds": len(diffs)}


def table(rows: Sequence[dict[str, object]]) -> str:
    def cell(value: object) -> str:
        assert isinstance(value, dict)
        return f"{value['mean']:.2f} ± {value['sd']:.2f}"

    body = [[r["policy"], cell(r["unallocated_100"]), cell(r["unallocated_130"]),
             cell(r["fragmentation_ratio_80"]), f"{r['seconds_per_run']:.1f}"] for r in rows]
    headers = ["policy", "unallocated GPU% @100% arrival", "@130% arrival", "frag. ratio @80%", "s/run"]
    return tabulate(body, headers=headers, tablefmt="github")


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
    parser.add_argument("--trace", choices=sorted(openb.TRACES), default="default")
    parser.add_argument("--policies", default=",".join(policy_names()), help="comma-separated policy names")
    parser.add_argument("--seeds", type=_seeds, default=list(openb.SEEDS), help="e.g. 42-51 or 42,43")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel replays")
    parser.add_argument("--out", type=Path, help="JSON results (default bench/out/replay_<trace>.json)")
    parser.add_argument("--plot", type=Path, help="also draw unallocated GPU%% against arrival into this PNG "
                        "(docs/img/unallocated_vs_arrival.png is the README's, from the default trace)")
    args = parser.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    known = (*policy_names(), *BENCH_POLICIES)
    unknown = [p for p in policies if p not in known]
    if unknown:
        parser.error(f"unknown policies {', '.join(unknown)}; choose from {', '.join(known)}")
    try:
        openb.load_nodes(args.data)
        openb.load_pods(args.data, args.trace)
    except openb.TraceError as exc:
        print(exc, file=sys.stderr)
        return 2
    started = time.perf_counter()
    results = run_all(args.data, args.trace, policies, args.seeds, args.jobs)
    wall = time.perf_counter() - started
    rows = summarize(results, policies)
    comparisons = {f"{p} vs {b}": c for p in policies for b in policies if p != b
                   for c in [paired(results, p, b)] if c is not None}
    print(table(rows))
    for label, comparison in comparisons.items():
        if label.endswith("vs fgd"):
            print(f"{label}: {comparison['mean_difference']:+.2f} points at 100% arrival, better on "
                  f"{comparison['better_seeds']}/{comparison['seeds']} seeds, worse on {comparison['worse_seeds']}")
    print(f"{len(results)} replays of the {args.trace} trace in {wall:.0f} s wall time with {args.jobs} jobs")
    out = args.out or DEFAULT_OUT / f"replay_{args.trace}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"trace": args.trace, "seeds": args.seeds, "wall_seconds": wall, "summary": rows,
                               "paired": comparisons, "runs": [asdict(r) for r in results]}, indent=1))
    print(f"results: {out}")
    if args.plot:
        plot(results, policies, args.trace, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
