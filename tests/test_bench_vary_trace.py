"""Varied pod lists: only what was asked for changes, within the bounds given, the same seed gives the same file, and
bad options are refused with a sentence that names them."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import pytest

from bench import openb, vary_trace
from bench.bench_filter import trace_shapes
from tests.test_bench_throughput import write_pods

PODS = [(4000, 8192, 1, 250, ""), (8000, 16384, 1, 500, ""), (16000, 32768, 2, 1000, ""), (2000, 4096, 0, 0, "")] * 10


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _vary(folder: Path, name: str, *options: str) -> list[dict[str, str]]:
    out = folder / name
    assert vary_trace.main(["--data", str(folder), "--trace", "default", "--out", str(out), *options]) == 0
    return _rows(out)


def test_each_change_touches_only_its_columns_and_pods_within_its_bounds(tmp_path: Path) -> None:
    write_pods(tmp_path, "default", PODS)
    write_pods(tmp_path, "gpuspec20", [(4000, 8192, 1, 500, "T4"), (4000, 8192, 1, 500, "G2|P100"),
                                       (4000, 8192, 1, 500, "")])
    original = _rows(tmp_path / openb.TRACES["default"])

    shares = _vary(tmp_path, "shares.csv", "--share-range", "50-60")
    for before, after in zip(original, shares, strict=True):
        sharing = 0 < int(before["gpu_milli"]) < 1000
        assert (50 <= int(after["gpu_milli"]) <= 60) if sharing else after["gpu_milli"] == before["gpu_milli"]
        assert {k: v for k, v in after.items() if k != "gpu_milli"} == {k: v for k, v in before.items()
                                                                         if k != "gpu_milli"}

    hosts = _vary(tmp_path, "hosts.csv", "--host-spread", "0.5")
    for before, after in zip(original, hosts, strict=True):
        for column in ("cpu_milli", "memory_mib"):
            assert int(int(before[column]) * 0.5) <= int(after[column]) <= int(before[column]) * 1.5
        assert (after["num_gpu"], after["gpu_milli"], after["gpu_spec"]) == (
            before["num_gpu"], before["gpu_milli"], before["gpu_spec"])
    assert len({row["cpu_milli"] for row in hosts}) > len({row["cpu_milli"] for row in original})

    specs = _vary(tmp_path, "specs.csv", "--spec-fraction", "1")
    for before, after in zip(original, specs, strict=True):
        expected = {"T4", "G2|P100"} if int(before["num_gpu"]) else {""}
        assert after["gpu_spec"] in expected
    # The benchmarks read the file: its GPU pods ask for the models drawn.
    drawn = trace_shapes(tmp_path, str(tmp_path / "specs.csv"), 40, seed=1, fleet="openb")
    assert all(shape.models for shape in drawn)


@pytest.mark.parametrize(("option", "kind"), [
    ("--share-demand", lambda row: 0 < int(row["gpu_milli"]) < 1000),
    ("--multi-gpu-demand", lambda row: int(row["num_gpu"]) > 1),
])
def test_a_demand_option_redraws_every_gpu_pod_so_that_its_kind_holds_that_share_of_the_gpu_demand(
        tmp_path: Path, option: str, kind: Callable[[dict[str, str]], bool]) -> None:
    write_pods(tmp_path, "default", PODS * 20)
    original = _rows(tmp_path / openb.TRACES["default"])

    def drawn_from(row: dict[str, str], pool: list[dict[str, str]]) -> bool:
        return any({**source, "name": row["name"]} == row for source in pool)

    def demand(rows: list[dict[str, str]]) -> int:
        return sum(int(row["num_gpu"]) * int(row["gpu_milli"]) for row in rows)

    gpu_pods = [row for row in original if int(row["num_gpu"])]
    pools = {"1": [row for row in gpu_pods if kind(row)], "0": [row for row in gpu_pods if not kind(row)]}
    for fraction, pool in pools.items():
        varied = _vary(tmp_path, f"f{fraction}.csv", option, fraction)
        assert [row["name"] for row in varied] == [row["name"] for row in original]
        for before, after in zip(original, varied, strict=True):
            # A pod without GPUs stays as it was; a GPU pod becomes one of the kind asked for, whole.
            assert after == before if not int(before["num_gpu"]) else drawn_from(after, pool)
    # Between the two, each pod one of the trace's GPU pods, the kind holding about the share of the demand asked
    # for (600 GPU pods), however far from it the trace's own share is (the default's: 0.6 shared, 0.4 multi-GPU).
    for fraction in (0.2, 0.8):
        mixed = [row for row in _vary(tmp_path, "mixed.csv", option, str(fraction), "--seed", "1")
                 if int(row["num_gpu"])]
        assert all(drawn_from(row, gpu_pods) for row in mixed)
        assert demand([row for row in mixed if kind(row)]) / demand(mixed) == pytest.approx(fraction, abs=0.06)


def test_the_same_seed_writes_the_same_file_and_another_seed_another(tmp_path: Path) -> None:
    write_pods(tmp_path, "default", PODS)
    first = _vary(tmp_path, "a.csv", "--share-range", "1-999", "--host-spread", "0.3", "--seed", "3")
    assert _vary(tmp_path, "b.csv", "--share-range", "1-999", "--host-spread", "0.3", "--seed", "3") == first
    assert _vary(tmp_path, "c.csv", "--share-range", "1-999", "--host-spread", "0.3", "--seed", "4") != first


@pytest.mark.parametrize(("options", "named"), [
    (["--share-range", "0-500"], "--share-range"),
    (["--share-range", "600-500"], "--share-range"),
    (["--share-range", "50-1000"], "--share-range"),
    (["--share-range", "fifty"], "--share-range"),
    (["--host-spread", "1"], "--host-spread"),
    (["--host-spread", "-0.1"], "--host-spread"),
    (["--spec-fraction", "1.5"], "--spec-fraction"),
    (["--share-demand", "-0.5"], "--share-demand"),
    (["--multi-gpu-demand", "most"], "--multi-gpu-demand"),
    (["--cpu-only-scale", "-1"], "--cpu-only-scale"),
    (["--cpu-only-scale", "11"], "--cpu-only-scale"),
    (["--cpu-only-scale", "double"], "--cpu-only-scale"),
])
def test_a_bad_option_is_refused_with_a_sentence_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], named: str) -> None:
    write_pods(tmp_path, "default", PODS)
    with pytest.raises(SystemExit) as exited:
        vary_trace.main(["--data", str(tmp_path), "--out", str(tmp_path / "x.csv"), *options])
    assert exited.value.code == 2
    assert f"argument {named}: {named}" in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()


def test_cpu_only_scale_writes_each_pod_without_gpus_about_that_many_times_and_no_other(tmp_path: Path) -> None:
    write_pods(tmp_path, "default", PODS * 10)
    original = _rows(tmp_path / openb.TRACES["default"])
    cpu_only = [row for row in original if not int(row["num_gpu"])]
    for scale, low, high in (("2", 200, 200), ("2.5", 225, 275), ("0", 0, 0), ("1", 100, 100)):
        varied = _vary(tmp_path, f"s{scale}.csv", "--cpu-only-scale", scale)
        # The GPU pods as they were, in order; each pod without GPUs written whole, under a name of its own.
        assert [row for row in varied if int(row["num_gpu"])] == [row for row in original if int(row["num_gpu"])]
        copies = [row for row in varied if not int(row["num_gpu"])]
        assert low <= len(copies) <= high
        assert len({row["name"] for row in varied}) == len(varied)
        by_name = {row["name"]: row for row in cpu_only}
        assert all({**by_name[row["name"].split("-c")[0]], "name": row["name"]} == row for row in copies)


def test_the_two_demand_options_are_refused_together(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_pods(tmp_path, "default", PODS)
    with pytest.raises(SystemExit) as exited:
        vary_trace.main(["--data", str(tmp_path), "--out", str(tmp_path / "x.csv"), "--share-demand", "0.8",
                         "--multi-gpu-demand", "0.5"])
    assert exited.value.code == 2
    assert "argument --multi-gpu-demand: not allowed with argument --share-demand" in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()


def test_a_trace_with_nothing_to_draw_from_is_refused_before_anything_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_pods(tmp_path, "default", PODS)
    write_pods(tmp_path, "gpuspec20", [(4000, 8192, 1, 500, "")])
    out = tmp_path / "x.csv"
    assert vary_trace.main(["--data", str(tmp_path), "--out", str(out), "--spec-fraction", "0.5"]) == 2
    assert "has no pod with a gpu_spec" in capsys.readouterr().err
    assert vary_trace.main(["--data", str(tmp_path), "--trace", "missing.csv", "--out", str(out)]) == 2
    assert "missing.csv" in capsys.readouterr().err
    write_pods(tmp_path, "gpushare40", [(4000, 8192, 1, 250, "")])
    broken = tmp_path / openb.TRACES["gpushare40"]
    broken.write_text(broken.read_text().replace(",250,", ",a quarter,"))
    assert vary_trace.main(["--data", str(tmp_path), "--trace", "gpushare40", "--out", str(out)]) == 2
    assert "gpu_milli='a quarter'" in capsys.readouterr().err
    # Pods that share a GPU asked for of a trace that has none, or pods that do not of one where all do.
    write_pods(tmp_path, "multigpu30", [(4000, 8192, 2, 1000, ""), (2000, 4096, 0, 0, "")])
    assert vary_trace.main(["--data", str(tmp_path), "--trace", "multigpu30", "--out", str(out),
                            "--share-demand", "0.5"]) == 2
    assert "--share-demand draws from the trace's GPU pods of both kinds, and it has none of one" in \
        capsys.readouterr().err
    write_pods(tmp_path, "gpushare60", [(4000, 8192, 1, 250, "")])
    assert vary_trace.main(["--data", str(tmp_path), "--trace", "gpushare60", "--out", str(out),
                            "--share-demand", "1"]) == 0
    out.unlink()
    assert vary_trace.main(["--data", str(tmp_path), "--trace", "gpushare60", "--out", str(out),
                            "--multi-gpu-demand", "0.9"]) == 2
    assert "--multi-gpu-demand draws from" in capsys.readouterr().err
    assert vary_trace.main(["--data", str(tmp_path), "--trace", "multigpu30", "--out", str(out),
                            "--share-demand", "0"]) == 0
    out.unlink()
    assert not out.exists()
