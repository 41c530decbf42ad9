"""The throughput benchmark's workload: pod shapes drawn from the trace the caller names."""

from __future__ import annotations

from pathlib import Path

from bench import openb
from bench.bench_throughput import Shape, trace_shapes

HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"


def write_pods(folder: Path, trace: str, rows: list[tuple[int, int, int, int]]) -> None:
    """A pod list of ``trace`` in ``folder``: (cpu_milli, memory_mib, num_gpu, gpu_milli) per pod."""
    lines = [HEADER] + [f"pod-{i},{cpu},{memory},{gpus},{milli},,LS,Running,0,0,0"
                        for i, (cpu, memory, gpus, milli) in enumerate(rows)]
    (folder / openb.TRACES[trace]).write_text("\n".join(lines) + "\n")


def test_shapes_come_from_the_named_trace_and_only_from_its_gpu_pods(tmp_path: Path) -> None:
    write_pods(tmp_path, "default", [(4000, 8192, 1, 500), (2000, 4096, 0, 0)])
    write_pods(tmp_path, "multigpu30", [(32000, 65536, 8, 1000), (2000, 4096, 0, 0)])
    assert set(trace_shapes(tmp_path, "default", 20, seed=1)) == {Shape(per_gpu_gib=8, gpus=1)}
    assert set(trace_shapes(tmp_path, "multigpu30", 20, seed=1)) == {Shape(per_gpu_gib=16, gpus=8)}
    with_hosts = trace_shapes(tmp_path, "multigpu30", 5, seed=1, trace_host_requests=True)
    assert set(with_hosts) == {Shape(per_gpu_gib=16, gpus=8, cpu="32000m", memory="65536Mi")}
