"""The in-process filter benchmark: both passes run the extender's filter and reserve on every pod, and the same
inputs give the same choices."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import bench_filter, openb
from tests.test_bench_throughput import write_pods


def test_both_passes_place_the_pods_and_the_same_inputs_give_the_same_choices(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / openb.NODE_FILE).write_text("sn,cpu_milli,memory_mib,gpu,model\n"
                                            "a,64000,262144,2,P100\nb,96000,393216,8,G2\n")
    write_pods(tmp_path, "gpuspec20", [(4000, 8192, 1, 250, "P100"), (8000, 16384, 1, 500, ""),
                                       (16000, 32768, 2, 1000, "G2")])
    argv = ["--nodes", "12", "--pods", "30", "--window", "5", "--data", str(tmp_path)]
    runs, stretches = [], []
    for _ in range(2):
        assert bench_filter.main(argv) == 0
        summary, by_stretch = capsys.readouterr().out.split("\n\n")
        runs.append(table_rows(summary))
        stretches.append(table_rows(by_stretch))
    rows = runs[0]
    assert [row[1].strip() for row in rows] == [bench_filter.BASELINE, "fgd-scarcity"]
    # 12 nodes hold the 30 pods: every filter passed a node and every reservation was made.
    assert [row[10].strip() for row in rows] == ["0", "0"]
    assert float(rows[1][7]) > 0  # the policy scored node states afresh
    # The slowest filter is no faster than the median (both in ms).
    assert all(float(row[5]) >= float(row[3]) for row in rows)
    assert [row[11] for row in runs[1]] == [row[11] for row in rows]  # the same choices, pod for pod
    # Each pass in fifths of its 30 pods, in order; the fifths' states scored afresh and times add up to the pass's.
    fifths = stretches[0]
    setups = (bench_filter.BASELINE, "fgd-scarcity")
    assert [(row[1].strip(), row[2].strip()) for row in fifths] == [
        (setup, f"{first}-{first + 5}") for setup in setups for first in range(1, 30, 6)]
    for summary_row in rows:
        mine = [row for row in fifths if row[1].strip() == summary_row[1].strip()]
        assert sum(float(row[5]) for row in mine) / 5 == pytest.approx(float(summary_row[7]), abs=0.06)
        assert sum(float(row[3]) for row in mine) / 5 == pytest.approx(float(summary_row[2]), abs=0.002)  # mean, ms


def table_rows(text: str) -> list[list[str]]:
    """The cells of each row of the GitHub table in ``text``, its header left out."""
    return [line.split("|") for line in text.splitlines() if line.startswith("| ")][1:]
