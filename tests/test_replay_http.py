"""The end-to-end replay (local cluster, extender process, scheduler loop) decides as the in-process replay."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from bench import openb
from bench.replay_http import compare, main, pod_manifest, replay_in_process, replay_over_http
from gpushare.contract import host_requests, parse_request, requests_gpu
from gpushare.kube.convert import pod_info
from gpushare.policies import DEFAULT_POLICY

SEED = 7
NODES = [  # sn, cpu_milli, memory_mib, gpu, model: GPU-dense nodes short of CPU, CPU-rich ones, a V100 pair
    ("openb-node-0", 32000, 131072, 8, "G2"),
    ("openb-node-1", 32000, 131072, 8, "G2"),
    ("openb-node-2", 96000, 262144, 2, "T4"),
    ("openb-node-3", 96000, 262144, 2, "T4"),
    ("openb-node-4", 16000, 65536, 2, "V100M16"),
    ("openb-node-5", 24000, 65536, 4, "V100M32"),
]
SHAPES = [  # cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec
    (4000, 8192, 1, 250, ""),
    (6000, 12288, 1, 460, ""),
    (8000, 16384, 1, 1000, ""),
    (2000, 4096, 1, 100, ""),
    (12000, 32768, 0, 0, ""),  # CPU-only
    (16000, 65536, 2, 1000, ""),  # several GPUs
    (4000, 8192, 1, 500, "V100M16|V100M32"),  # a model rule
    (3000, 8192, 1, 700, ""),
    (2000, 8192, 1, 573, ""),  # a share of three digits, weighed with its class (570)
]


def write_trace(folder: Path, pods: int = 48) -> Path:
    with (folder / openb.NODE_FILE).open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["sn", "cpu_milli", "memory_mib", "gpu", "model"])
        writer.writerows(NODES)
    with (folder / openb.TRACES["default"]).open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec"])
        for i in range(pods):
            writer.writerow([f"openb-pod-{i:04d}", *SHAPES[(i * 5) % len(SHAPES)]])
    return folder


def test_every_decision_over_http_equals_the_in_process_replay(tmp_path: Path) -> None:
    data = write_trace(tmp_path)
    trace_nodes, trace_pods = openb.load_nodes(data), openb.load_pods(data)
    order = openb.arrival_order(trace_pods, SEED, openb.capacity(trace_nodes))
    expected, expected_unallocated = replay_in_process(trace_nodes, trace_pods, order, DEFAULT_POLICY, SEED)
    workdir = tmp_path / "run"
    workdir.mkdir()
    outcome = replay_over_http(trace_nodes, trace_pods, order, DEFAULT_POLICY, SEED, workdir)

    comparison = compare(expected, outcome.decisions)
    assert comparison.first_divergence is None
    assert comparison.identical == len(order) > len(trace_pods)  # the arrival order drew extra copies
    assert outcome.unallocated == pytest.approx(expected_unallocated)
    # The comparison covers what matters: failures, CPU-only pods, several GPUs, a model rule, many nodes.
    by_name = {p.name: p for p in order}
    placed = [d for d in outcome.decisions if d.node is not None]
    assert len(placed) < len(order)
    assert any(not by_name[d.pod].num_gpu for d in placed)
    assert any(len(d.gpus) == 2 for d in placed)
    assert all(d.node in ("openb-node-4", "openb-node-5") for d in placed if by_name[d.pod].gpu_spec)
    assert len({d.node for d in placed}) == len(NODES)


def test_a_divergence_is_reported_with_both_choices() -> None:
    from bench.replay import Decision

    same, other = Decision("a", "n1", (0,)), Decision("b", "n2", (1,))
    comparison = compare([same, other], [same, Decision("b", "n2", (0,))])
    assert (comparison.identical, comparison.percent) == (1, 50.0)
    assert comparison.first_divergence == (other, Decision("b", "n2", (0,)))


@pytest.mark.parametrize("pod", [openb.TracePod("p", 4000, 8192, 2, 500, "V100M16|V100M32"),
                                 openb.TracePod("q", 12000, 32768, 0, 0)])
def test_the_manifest_asks_for_what_the_trace_says(pod: openb.TracePod) -> None:
    info = pod_info(pod_manifest(pod))
    if pod.num_gpu:
        got, want = parse_request(info), pod.request()
        assert (got.gpu_count, got.per_gpu, got.models, got.cpu_milli, got.memory_mib) == (
            want.gpu_count, want.per_gpu, want.models, want.cpu_milli, want.memory_mib)
    else:
        assert not requests_gpu(info)
        assert host_requests(info) == (pod.cpu_milli, pod.memory_mib)


@pytest.mark.parametrize(("trace", "said"), [
    ("bogus", "Unknown trace 'bogus'; choose one of default, "),
    ("missing.csv", "Cannot read {folder}/missing.csv: "),
])
def test_a_trace_that_is_neither_a_name_nor_a_file_is_refused_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], trace: str, said: str) -> None:
    data = write_trace(tmp_path)
    assert main(["--data", str(data), "--trace", trace if trace == "bogus" else str(tmp_path / trace)]) == 2
    captured = capsys.readouterr()
    assert said.format(folder=tmp_path) in captured.err and not captured.out
