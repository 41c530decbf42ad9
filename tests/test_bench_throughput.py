"""The throughput benchmark: pod shapes drawn from the trace the caller names, and each row's ratio to the floor."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from bench import openb
from bench.bench_throughput import (
    Row,
    Shape,
    cluster,
    full_collections_deferred,
    main,
    manifest,
    ratios,
    summary,
    table,
    thread_wait_s,
    trace_shapes,
)
from extender.collector import FULL_COLLECTION_AFTER
from gpushare.contract import ANN_GPU_COUNT, ANN_GPU_MODEL, RESOURCE_GPU_MEM

HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"


def write_pods(folder: Path, trace: str, rows: list[tuple[int, int, int, int, str]]) -> None:
    """A pod list of ``trace`` in ``folder``: (cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec) per pod."""
    lines = [HEADER] + [f"pod-{i},{cpu},{memory},{gpus},{milli},{models},LS,Running,0,0,0"
                        for i, (cpu, memory, gpus, milli, models) in enumerate(rows)]
    (folder / openb.TRACES[trace]).write_text("\n".join(lines) + "\n")


def test_shapes_come_from_the_named_trace_and_only_from_its_gpu_pods(tmp_path: Path) -> None:
    write_pods(tmp_path, "default", [(4000, 8192, 1, 500, ""), (2000, 4096, 0, 0, "")])
    write_pods(tmp_path, "multigpu30", [(32000, 65536, 8, 1000, ""), (2000, 4096, 0, 0, "")])
    assert set(trace_shapes(tmp_path, "default", 20, seed=1)) == {Shape(per_gpu=8, gpus=1)}
    assert set(trace_shapes(tmp_path, "multigpu30", 20, seed=1)) == {Shape(per_gpu=16, gpus=8)}
    with_hosts = trace_shapes(tmp_path, "multigpu30", 5, seed=1, trace_host_requests=True)
    assert set(with_hosts) == {Shape(per_gpu=16, gpus=8, cpu="32000m", memory="65536Mi")}


def test_the_openb_fleet_repeats_the_node_list_and_its_pods_keep_their_share_and_models(tmp_path: Path) -> None:
    (tmp_path / openb.NODE_FILE).write_text("sn,cpu_milli,memory_mib,gpu,model\n"
                                            "a,64000,262144,2,P100\nb,96000,393216,8,G2\n")
    spec = cluster(5, "openb", tmp_path)
    assert [n.name for n in spec.nodes] == [f"node-{i:05d}" for i in range(5)]
    assert [(len(n.gpus), n.gpus[0].model) for n in spec.nodes] == [(2, "P100"), (8, "G2")] * 2 + [(2, "P100")]
    assert {g.memory_mib for n in spec.nodes for g in n.gpus} == {openb.GPU_UNITS}
    assert spec.nodes[1].cpu == "96000m"

    write_pods(tmp_path, "gpuspec10", [(4000, 8192, 1, 250, "V100M16|V100M32"), (8000, 16384, 2, 1000, "")])
    shapes = set(trace_shapes(tmp_path, "gpuspec10", 40, seed=3, fleet="openb"))
    assert shapes == {Shape(per_gpu=250, gpus=1, models="V100M16|V100M32"), Shape(per_gpu=1000, gpus=2)}
    fractional = manifest("p", Shape(per_gpu=250, gpus=1, models="V100M16|V100M32"))
    assert fractional["metadata"]["annotations"] == {ANN_GPU_MODEL: "V100M16|V100M32"}
    assert fractional["spec"]["containers"][0]["resources"]["limits"] == {RESOURCE_GPU_MEM: "250"}
    whole = manifest("q", Shape(per_gpu=1000, gpus=2))
    assert whole["metadata"]["annotations"] == {ANN_GPU_COUNT: "2"}
    assert whole["spec"]["containers"][0]["resources"]["limits"] == {RESOURCE_GPU_MEM: "2000"}


def row(setup: str, pods_per_s: float, round_: int = 1) -> Row:
    return Row(setup, pods_per_s, 100, None, None, None, None, None, 1.0, 1.0, 420.0, round=round_)


def test_each_row_is_measured_against_the_floors_just_before_and_after_it() -> None:
    # One round, as before: both rows against the mean of the first floor and the last.
    one = [row("floor: no extender", 400), row("null extender", 380), row("fgd-scarcity", 300),
           row("floor again: no extender", 200)]
    assert ratios(one) == pytest.approx([400 / 300, 380 / 300, 300 / 300, 200 / 300])
    # Three rounds: each row against the floors around it, not a floor of another round.
    three = [row("floor: no extender", 400), row("fgd-scarcity", 320, 1), row("floor again: no extender", 400, 1),
             row("fgd-scarcity", 240, 2), row("floor again: no extender", 200, 2),
             row("fgd-scarcity", 330, 3), row("floor again: no extender", 420, 3)]
    assert ratios(three)[1::2] == pytest.approx([0.8, 0.8, 330 / 310])
    text = summary(three)
    assert len(text.splitlines()) == 3  # the header, its rule and one setup: no floor
    cells = [cell.strip() for cell in text.splitlines()[-1].strip("|").split("|")]
    assert cells[:3] == ["fgd-scarcity", "3", "320"] and float(cells[3]) == 0.8 and cells[4] == "0.80-1.06"
    assert "fgd-scarcity (round 2)" in table(three) and "(round" not in table(one)


def test_an_unknown_transport_is_refused_with_the_ones_there_are(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--transports", "http,tls"])
    assert exited.value.code == 2
    assert ("argument --transports: takes a comma-separated list of http, mtls-ecdsa, mtls-rsa, not 'http,tls'"
            in capsys.readouterr().err)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command for certificates")
def test_every_row_binds_every_pod_and_over_mutual_tls_the_loop_presents_its_certificate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The whole benchmark, small: three processes, plain HTTP and mutual TLS rows, the table they print.
    write_pods(tmp_path, "default", [(1000, 2048, 1, 250, ""), (1000, 2048, 1, 1000, ""), (1000, 2048, 2, 1000, "")])
    assert main(["--nodes", "3", "--pods", "12", "--policies", "binpack", "--transports", "http,mtls-ecdsa",
                 "--data", str(tmp_path), "--scrape-interval", "0"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    rows = {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines[1:])}
    assert list(rows) == ["floor: no extender", "null extender: HTTP and the Binding only", "binpack, chosen in filter",
                          "binpack, chosen in filter, mutual TLS (ECDSA P-256)", "floor again: no extender"]
    assert all(cells[3] == "12" for cells in rows.values())  # bound
    # The extender's rows measured its CPU and the connections the loop opened (at least one each).
    for setup in ("binpack, chosen in filter", "binpack, chosen in filter, mutual TLS (ECDSA P-256)"):
        assert float(rows[setup][7]) > 0 and float(rows[setup][-1]) > 0


def test_fewer_than_one_round_is_refused_before_anything_starts(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--rounds", "0"])
    assert exited.value.code == 2 and "--rounds must be at least 1, not 0." in capsys.readouterr().err


@pytest.mark.skipif(not Path("/proc/thread-self/schedstat").exists(), reason="the kernel keeps no schedstat per thread")
def test_a_thread_kept_from_the_cores_shows_its_wait_and_one_that_is_gone_shows_none() -> None:
    # Processes that never block, twice as many as the machine has cores, beside this thread spinning too.
    me = threading.get_native_id()
    before = thread_wait_s(os.getpid(), me)
    spin = "import time\nend = time.monotonic() + 0.5\nwhile time.monotonic() < end: pass"
    busy = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2 * (os.cpu_count() or 1))]
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        pass
    for process in busy:
        process.wait(timeout=30)
    after = thread_wait_s(os.getpid(), me)
    assert before is not None and after is not None and after > before
    assert thread_wait_s(os.getpid(), 2**22 + 7) is None  # above the kernel's largest thread id
    waited = replace(row("fgd-scarcity", 300), loop_wait_ms=0.5, extender_wait_ms=0.25)
    assert "0.50 / 0.25" in table([row("floor: no extender", 400), waited])
    assert "0.50 / 0.25" not in table([row("floor: no extender", 400), row("fgd-scarcity", 300)])


def test_a_run_defers_full_collections_and_leaves_the_collector_as_it_found_it() -> None:
    before = gc.get_threshold()
    with full_collections_deferred():
        assert gc.get_threshold() == (before[0], before[1], FULL_COLLECTION_AFTER)
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError), full_collections_deferred():
        raise RuntimeError("a run that fails")
    assert gc.get_threshold() == before
