"""The trace replay on a tiny synthetic openb-format trace: same decisions as ``choose_node``, the
paper's pod order, the reusable pieces for an end-to-end replay, and the command line."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bench import openb, replay, workload_seed
from bench.baselines import PaperBestFit
from gpushare.contract import MemoryUnit, NodeInfo, PodRequest, parse_request
from gpushare.model import GPU, Node, build_gpus
from gpushare.policies import choose_node, policy_names
from gpushare.policies.base import ClusterAware
from gpushare.policies.simple import Binpack
from gpushare.policies.workload import load_workload

NODE_KINDS = [("G2", 8, 96000, 393216), ("T4", 2, 104000, 524288), ("P100", 2, 16000, 122880)]


def write_trace(folder: Path, pods: int = 90, seed: int = 7) -> Path:
    """A small cluster (30 GPUs) and a pod list shaped like openb's: shares, whole GPUs, CPU-only pods,
    multi-GPU pods and model constraints."""
    rng = random.Random(seed)
    nodes = ["sn,cpu_milli,memory_mib,gpu,model"]
    for i, (model, gpus, cpu, memory) in enumerate(NODE_KINDS * 3):
        nodes.append(f"openb-node-{i:04d},{cpu},{memory},{gpus},{model}")
    rows = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
            "scheduled_time"]
    shapes = [(1, 500, 6000, ""), (1, 250, 3000, ""), (1, 1000, 12000, ""), (0, 0, 8000, ""),
              (2, 1000, 16000, ""), (1, 470, 12000, "T4|P100"), (1, 1000, 11000, "G2"), (1, 810, 3152, "")]
    for i in range(pods):
        gpus, milli, cpu, spec = rng.choice(shapes)
        rows.append(f"openb-pod-{i:04d},{cpu},{cpu * 4},{gpus},{milli},{spec},LS,Running,0,0,0")
    (folder / openb.NODE_FILE).write_text("\n".join(nodes) + "\n")
    (folder / openb.TRACES["default"]).write_text("\n".join(rows) + "\n")
    return folder


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return write_trace(tmp_path)


def test_arrival_order_follows_the_papers_protocol(tmp_path: Path) -> None:
    trace = write_trace(tmp_path, pods=40)
    pods = openb.load_pods(trace)
    capacity = openb.capacity(openb.load_nodes(trace))
    assert sum(p.gpu_demand for p in pods) < capacity
    order = openb.arrival_order(pods, 42, capacity)
    assert sorted(p.name for p in order[:len(pods)]) == sorted(p.name for p in pods)
    assert [p.name for p in order[:len(pods)]] != sorted(p.name for p in pods)
    assert order == openb.arrival_order(list(reversed(pods)), 42, capacity), "input order must not matter"
    assert order != openb.arrival_order(pods, 43, capacity)
    demand = sum(p.gpu_demand for p in order)
    assert demand <= 1.3 * capacity < demand + 1000
    extra = order[len(pods):]
    assert extra and all("-t" in p.name for p in extra)
    originals = {p.name: p for p in pods}
    for copy in extra:
        source = originals[copy.name.split("-t")[0]]
        assert (copy.cpu_milli, copy.num_gpu, copy.gpu_milli, copy.gpu_spec) == (
            source.cpu_milli, source.num_gpu, source.gpu_milli, source.gpu_spec)


def test_a_trace_asking_for_more_is_cut_down_at_random(trace: Path) -> None:
    pods = openb.load_pods(trace)
    capacity = openb.capacity(openb.load_nodes(trace))
    assert sum(p.gpu_demand for p in pods) > 1.3 * capacity
    order = openb.arrival_order(pods, 42, capacity)
    assert sum(p.gpu_demand for p in order) <= 1.3 * capacity
    assert len({p.name for p in order}) == len(order) and not any("-t" in p.name for p in order)


@pytest.mark.parametrize("name", policy_names())
@pytest.mark.parametrize("seed", [42, 43])
def test_the_fast_replay_decides_exactly_like_choose_node(trace: Path, name: str, seed: int) -> None:
    pods = openb.load_pods(trace)
    order = openb.arrival_order(pods, seed, openb.capacity(openb.load_nodes(trace)))
    fast_nodes = openb.build_nodes(openb.load_nodes(trace))
    fast_policy = replay.build_policy(name, pods, fast_nodes)
    fast = [(d.pod, d.node, d.gpus) for d in replay.replay(fast_nodes, order, fast_policy, seed)]
    nodes = openb.build_nodes(openb.load_nodes(trace))
    policy = replay.build_policy(name, pods, nodes)
    watcher = policy if isinstance(policy, ClusterAware) else None
    if watcher is not None:
        watcher.observe_nodes(nodes)
    slow: list[tuple[str, str | None, tuple[int, ...]]] = []
    for pod in order:
        request = pod.request()
        policy.observe(request)
        # The engine keeps "does not fit" answers across version changes: None exactly when it does not fit.
        assert all((policy.evaluate(n, request) is None) == (not n.fits(request)) for n in nodes)
        chosen = choose_node(nodes, request, policy, seed)
        if chosen is None:
            slow.append((pod.name, None, ()))
            continue
        chosen[0].place(pod.name, request, chosen[1].gpus)
        if watcher is not None:
            watcher.observe_nodes((chosen[0],))
        slow.append((pod.name, chosen[0].name, chosen[1].gpus))
    assert fast == slow
    assert any(node is None for _, node, _ in fast), "the trace must overflow the cluster"
    assert [(n.cpu_used, [g.used for g in n.gpus]) for n in fast_nodes] == [
        (n.cpu_used, [g.used for g in n.gpus]) for n in nodes]


class RecordingBinpack(Binpack):
    """Binpack that remembers which pods' requests it was shown."""

    def __init__(self) -> None:
        self.shown: list[PodRequest] = []

    def observe(self, request: PodRequest) -> None:
        self.shown.append(request)


def test_the_policy_learns_only_from_pods_kube_scheduler_asks_the_extender_about() -> None:
    # One node, two GPUs of 1000 units; 600 used on each leaves 800 free in all, no GPU with 700.
    nodes = openb.build_nodes([openb.TraceNode("openb-node-0000", 16000, 65536, 2, "T4")])
    nodes[0].place("filler", PodRequest(per_gpu=600, gpu_count=2, cpu_milli=1000), (0, 1))
    per_node = openb.TracePod("per-node", 1000, 1024, 1, 700)  # 800 free on the node: kube-scheduler asks
    too_much = openb.TracePod("too-much", 1000, 1024, 1, 900)  # more than the node's 800: it never asks
    cpu_short = openb.TracePod("cpu-short", 32000, 1024, 0, 0)  # more CPU than the node has
    assert [replay.kube_scheduler_asks(nodes, p.request()) for p in (per_node, too_much, cpu_short)] == [
        True, False, False]

    shown = RecordingBinpack()
    decisions = list(replay.replay(nodes, [per_node, too_much, cpu_short], shown, 1,
                                   shown_as_by_kube_scheduler=True))
    assert [d.node for d in decisions] == [None, None, None]  # no GPU has 700 free
    assert shown.shown == [per_node.request()]
    every = RecordingBinpack()
    list(replay.replay(nodes, [per_node, too_much, cpu_short], every, 1))
    assert every.shown == [p.request() for p in (per_node, too_much, cpu_short)]


def test_trace_pods_become_the_requests_the_extender_would_parse(trace: Path) -> None:
    for pod in openb.load_pods(trace):
        request = pod.request()
        if pod.num_gpu == 0:
            assert (request.gpu_count, request.per_gpu, request.cpu_milli) == (0, 0, pod.cpu_milli)
            continue
        parsed = parse_request(pod.pod_info())
        assert (parsed.gpu_count, parsed.per_gpu, parsed.models, parsed.cpu_milli, parsed.memory_mib) == (
            request.gpu_count, request.per_gpu, request.models, request.cpu_milli, request.memory_mib)
    constrained = next(p for p in openb.load_pods(trace) if p.gpu_spec == "T4|P100")
    assert constrained.request().models.accepts("P100") and not constrained.request().models.accepts("G2")


def test_the_cluster_spec_describes_every_gpu_as_1000_mib(trace: Path) -> None:
    nodes = openb.load_nodes(trace)
    spec = openb.cluster_spec(nodes)
    assert len(spec.nodes) == len(nodes)
    first = spec.nodes[0]
    assert (first.name, first.cpu, first.memory, len(first.gpus)) == ("openb-node-0000", "96000m", "393216Mi", 8)
    assert {(g.model, g.memory_mib) for g in first.gpus} == {("G2", 1000)}
    from_spec = build_gpus(NodeInfo(name=first.name, annotations={"gpushare.io/gpu-inventory": json.dumps(
        [{"index": i, "model": g.model, "memoryMiB": g.memory_mib} for i, g in enumerate(first.gpus)])}),
        MemoryUnit.MiB)
    assert [(g.model, g.total) for g in from_spec] == [(g.model, g.total) for g in nodes[0].node().gpus]


def test_one_run_reports_the_papers_metrics(trace: Path) -> None:
    result = replay.run_one(trace, "default", "fgd-lookahead", 42)
    assert set(result.unallocated) == {"100", "130"}
    assert 0 <= result.unallocated["130"] <= result.unallocated["100"] < 100
    assert 0 <= result.fragmentation_ratio <= 1
    assert result.curve[0] == 100.0 and len(result.curve) >= 2 * 100
    assert result.evaluations > 0


def test_the_command_line_writes_table_json_and_plot(trace: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out, image = tmp_path / "out.json", tmp_path / "plot.png"
    code = replay.main(["--data", str(trace), "--policies", "binpack,fgd", "--seeds", "42-43", "--jobs", "1",
                        "--out", str(out), "--plot", str(image)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "unallocated GPU% @100% arrival" in printed and "vs fgd @100%" in printed
    data = json.loads(out.read_text())
    rows = data["summary"]["default"]
    assert [row["policy"] for row in rows] == ["binpack", "fgd"]
    assert len(data["runs"]) == 4 and rows[0]["vs_fgd_100"]["seeds"] == 2 and "vs_binpack_100" in rows[1]
    assert image.read_bytes().startswith(b"\x89PNG")


def test_the_command_line_shows_progress_and_draws_no_plot_unless_asked(trace: Path, tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    committed = openb.REPO_ROOT / "docs" / "img" / "unallocated_vs_arrival.png"
    before = committed.stat().st_mtime_ns
    out = tmp_path / "results"
    code = replay.main(["--data", str(trace), "--policies", "binpack", "--seeds", "42-43", "--jobs", "2",
                        "--out", str(out / "out.json")])
    assert code == 0
    printed = capsys.readouterr()
    assert "default binpack seed 42:" in printed.err and "default binpack seed 43:" in printed.err
    assert "seed 42:" not in printed.out and "plot:" not in printed.out
    assert committed.stat().st_mtime_ns == before
    assert list(out.iterdir()) == [out / "out.json"]


def test_the_papers_bestfit_ranks_nodes_by_what_is_left_on_the_whole_node(trace: Path, tmp_path: Path) -> None:
    # binpack goes where the chosen card is left fullest; BestFit where the node has least CPU and GPU left:
    # 100 x (1 - (CPU left / 128 cores + GPUs left / 8) / 2), truncated.
    empty_card_on_busy_node = Node("busy", [GPU(0, "T4", 1000), GPU(1, "T4", 1000, used=1000, holders=1)],
                                   cpu_milli=64000, cpu_used=60000)
    tight_card_on_idle_node = Node("idle", [GPU(0, "T4", 1000, used=600, holders=1), GPU(1, "T4", 1000)],
                                   cpu_milli=64000)
    pod = PodRequest(per_gpu=400, gpu_count=1, cpu_milli=2000)
    busy, idle = (PaperBestFit().evaluate(n, pod) for n in (empty_card_on_busy_node, tight_card_on_idle_node))
    assert busy is not None and idle is not None
    assert busy.score == int((1 - (2000 / 128000 + 0.6 / 8) / 2) * 100) == 95 and busy.gpus == (0,)
    assert idle.score == int((1 - (62000 / 128000 + 1.0 / 8) / 2) * 100) == 69 and idle.gpus == (0,)
    packed = choose_node([empty_card_on_busy_node, tight_card_on_idle_node], pod, Binpack())
    assert packed is not None and packed[0].name == "idle"
    out = tmp_path / "bestfit.json"
    code = replay.main(["--data", str(trace), "--policies", "bestfit,binpack", "--seeds", "42", "--jobs", "1",
                        "--out", str(out), "--plot", str(tmp_path / "bestfit.png")])
    assert code == 0
    assert [r["policy"] for r in json.loads(out.read_text())["summary"]["default"]] == ["bestfit", "binpack"]


def test_missing_trace_files_are_reported_with_a_hint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert replay.main(["--data", str(tmp_path), "--seeds", "42"]) == 2
    assert "Pass the openb folder with --data" in capsys.readouterr().err
    (tmp_path / openb.NODE_FILE).write_text("sn,cpu_milli\nx,1\n")
    with pytest.raises(openb.TraceError, match="lacks the columns memory_mib, gpu, model"):
        openb.load_nodes(tmp_path)
    with pytest.raises(SystemExit):
        replay.main(["--data", str(tmp_path), "--policies", "best"])


def test_a_workload_seed_file_is_derived_from_the_trace(trace: Path, tmp_path: Path) -> None:
    seed = tmp_path / "seed.yaml"
    assert workload_seed.main(["--data", str(trace), "--out", str(seed)]) == 0
    weights = load_workload(seed)
    assert sum(weights.values()) == len(openb.load_pods(trace))


def test_pod_files_run_side_by_side_with_a_summary_and_the_published_figures(
        trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "extra" / "openb_pod_list_heldout.csv"
    other.parent.mkdir()
    other.write_text((trace / openb.TRACES["default"]).read_text())
    (trace / "README.md").write_text("| Random | FGD |\n|---|---|\n| 13.70 | 4.77 |\n\n"
                                     "| trace | BestFit | FGD |\n|---|---|---|\n| heldout | 6.90 | 5.34 |\n")
    assert replay.published_figures(trace) == {"default": {"Random": 13.7, "FGD": 4.77},
                                               "heldout": {"BestFit": 6.9, "FGD": 5.34}}
    out = tmp_path / "suite.json"
    code = replay.main(["--data", str(trace), "--trace", "default", "--pods", str(other), "--policies",
                        "binpack,fgd,fgd-scarcity", "--seeds", "42-43", "--jobs", "1", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "## default" in printed and "## heldout" in printed and "## all 2 traces" in printed
    assert "published: BestFit 6.90, FGD 5.34" in printed
    assert "published FGD, mean over the 2 traces that have it: 5.05" in printed
    data = json.loads(out.read_text())
    assert data["traces"] == ["default", "heldout"]
    assert {r["trace"] for r in data["runs"]} == {"default", "heldout"}
