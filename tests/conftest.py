"""Shared fixtures: a running local cluster, a helper to describe one, short socket folders, the chart as
rendered, the garbage collections a block of a test sees, and a check that the tests leave nothing behind in the
temp directory."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpushare.clusterspec import ClusterSpec
from gpushare.localcluster import LocalCluster


@contextmanager
def gc_collections() -> Iterator[list[int]]:
    """The generations CPython collects while the block runs, in order (``gc.callbacks``)."""
    seen: list[int] = []

    def record(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop":
            seen.append(info["generation"])

    gc.callbacks.append(record)
    try:
        yield seen
    finally:
        gc.callbacks.remove(record)


def cluster_spec(nodes: int = 2, gpus: int = 2, memory_mib: int = 16160, model: str = "Tesla-V100-SXM2-16GB",
                 prefix: str = "node") -> ClusterSpec:
    """``nodes`` identical nodes named ``{prefix}-0``..., each with ``gpus`` GPUs on NUMA node 0."""
    return ClusterSpec.model_validate({"nodes": [
        {"name": f"{prefix}-{i}", "gpus": [{"model": model, "memoryMiB": memory_mib, "numa": 0}] * gpus}
        for i in range(nodes)]})


@pytest.fixture(scope="session")
def chart_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What scripts/check_chart.sh wrote: a folder per ci/ values file, rendered with the Prometheus Operator's API."""
    out = tmp_path_factory.mktemp("chart")
    result = subprocess.run([str(Path(__file__).resolve().parents[1] / "scripts" / "check_chart.sh"), str(out)],
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "chart OK" in result.stdout
    return out


@pytest.fixture
def local_cluster() -> Iterator[LocalCluster]:
    """A local API server with ``cluster_spec()``'s two nodes, inventory published."""
    with LocalCluster(cluster_spec()) as cluster:
        yield cluster


def driver_gpus() -> list[tuple[str, int]] | None:
    """The UUID and memory (MiB) of each GPU as NVML itself reports them; ``None`` where NVML does not start (no
    NVIDIA driver): what the GPU-node tests hold the plugin's view against."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        return [(str(pynvml.nvmlDeviceGetUUID(h)), int(pynvml.nvmlDeviceGetMemoryInfo(h).total) >> 20)
                for h in handles]
    finally:
        pynvml.nvmlShutdown()


# The NVML backend's two paths: CI machines have no driver, a GPU node has one, and each path's tests run where it
# can be taken (run the suite on a GPU node to exercise the second).
_HAS_DRIVER = driver_gpus() is not None
without_driver = pytest.mark.skipif(_HAS_DRIVER, reason="tests the path of a node without the NVIDIA driver, and "
                                                        "this machine has one")
with_driver = pytest.mark.skipif(not _HAS_DRIVER, reason="needs the NVIDIA driver and a GPU (run on a GPU node)")


def answer_json(handler: BaseHTTPRequestHandler, body: bytes) -> None:
    """A fake server's 200 answer with a JSON body, on a connection that stays open."""
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


@contextmanager
def short_tmpdir() -> Iterator[Path]:
    """A folder for unix sockets, removed afterwards. A socket path must fit in about 108 bytes, which
    pytest's tmp_path (or a TMPDIR like macOS's /var/folders/...) can exceed, so it lives directly under /tmp."""
    directory = Path(tempfile.mkdtemp(dir="/tmp", prefix="gs-"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def leave_no_temp_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Fail the run if the tests or the processes they start leave anything in the temp directory.

    The session gets a temp directory of its own (TMPDIR, inherited by subprocesses): whatever is left in it at
    the end was left by this run, not by another test run or program sharing /tmp, which a snapshot of /tmp
    itself would blame on us. pytest's own basetemp stays in the system temp directory, where its retention
    policy applies.
    """
    tmp_path_factory.getbasetemp()  # fixed before TMPDIR moves, so tmp_path keeps working as usual
    saved_env, saved_tempdir = os.environ.get("TMPDIR"), tempfile.tempdir
    session_tmp = tempfile.mkdtemp(prefix="gs-tests-")
    os.environ["TMPDIR"] = tempfile.tempdir = session_tmp
    try:
        yield
    finally:
        tempfile.tempdir = saved_tempdir
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
        leaked = sorted(os.listdir(session_tmp))
        shutil.rmtree(session_tmp, ignore_errors=True)
    if leaked:
        pytest.fail(f"The tests left {len(leaked)} entries in the temp directory ({', '.join(leaked)}); the code "
                    "that made them must remove them (use tmp_path, or conftest.short_tmpdir for unix sockets).",
                    pytrace=False)
