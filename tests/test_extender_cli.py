"""``gpushare-extender`` as a process: flags, environment, JSON logs, HTTPS."""

from __future__ import annotations

import http.client
import json
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from test_extender_harness import T4, T4_MIB, gpu_node, spec

from extender.config import ConfigError, parse_config
from gpushare.contract import MemoryUnit
from gpushare.localcluster import LocalCluster
from gpushare.policies import DEFAULT_POLICY


@contextmanager
def extender_process(*flags: str, env: dict[str, str] | None = None) -> Iterator[tuple[str, list[dict[str, object]]]]:
    """Run the console script until it logs its address; yields the URL and the JSON log lines so far."""
    process = subprocess.Popen([sys.executable, "-m", "extender", "--host", "127.0.0.1", *flags],
                               stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    assert process.stderr is not None
    logs: list[dict[str, object]] = []
    try:
        for line in process.stderr:
            logs.append(json.loads(line))
            message = str(logs[-1]["msg"])
            if message.startswith("Uvicorn running on "):
                yield message.split()[3], logs
                return
        raise AssertionError(f"the extender exited without serving: {logs}")
    finally:
        process.terminate()
        process.wait(timeout=15)


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with LocalCluster(spec(gpu_node("n1", (T4, T4_MIB)))) as cluster:
        yield str(cluster.write_kubeconfig(tmp_path_factory.mktemp("kube") / "config"))


def wait_ready(url: str, **kwargs: object) -> None:
    deadline = time.monotonic() + 20
    while httpx.get(url + "/readyz", **kwargs).status_code != 200:  # type: ignore[arg-type]
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_serves_with_json_logs(kubeconfig: str) -> None:
    with extender_process("--kubeconfig", kubeconfig, "--port", "0", "--unit", "MiB") as (url, logs):
        wait_ready(url)
        view = httpx.get(url + "/gpushare-scheduler/inspect/n1").json()
        assert view["nodes"][0]["totalGPU"] == 15  # the node publishes GiB: its unit wins over --unit
    started = next(entry for entry in logs if entry["msg"] == "starting gpushare extender")
    assert started["level"] == "INFO" and started["unit"] == "MiB" and started["policy"] == DEFAULT_POLICY
    # The lock installs uvloop wherever the tests run (not on Windows), and the extender serves on it.
    assert started["event_loop"] == "uvloop"
    assert all("color_message" not in entry for entry in logs)


def test_an_idle_connection_stays_open_past_uvicorns_default_so_kube_scheduler_is_the_one_to_close_it(
        kubeconfig: str) -> None:
    """kube-scheduler keeps an idle connection 90 s: a server that closed it first could cross a POST being sent."""
    with extender_process("--kubeconfig", kubeconfig, "--port", "0") as (url, _):
        wait_ready(url)
        parts = urlsplit(url)
        assert parts.hostname is not None
        connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
        try:
            connection.request("GET", "/version")
            first = connection.getresponse()
            first.read()
            assert first.status == 200 and not first.will_close
            kept = connection.sock
            time.sleep(6.5)  # past uvicorn's default keep-alive of 5 s
            assert select.select([kept], [], [], 0)[0] == [], "the extender closed an idle connection"
            connection.request("GET", "/version")
            assert connection.getresponse().status == 200 and connection.sock is kept
        finally:
            connection.close()


def test_serves_on_asyncio_where_uvloop_does_not_import(kubeconfig: str, tmp_path: Path) -> None:
    """Where uvloop does not install (Windows), the extender serves on asyncio's own loop and says so."""
    shadow = tmp_path / "uvloop"
    shadow.mkdir()
    (shadow / "__init__.py").write_text('raise ImportError("uvloop is not built for this platform")\n')
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p)
    with extender_process("--kubeconfig", kubeconfig, "--port", "0", env={"PYTHONPATH": path}) as (url, logs):
        wait_ready(url)
        assert httpx.get(url + "/version").json() == {"version": "0.1.0"}
    started = next(entry for entry in logs if entry["msg"] == "starting gpushare extender")
    assert started["event_loop"] == "asyncio"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_serves_https(kubeconfig: str, tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
    with extender_process("--kubeconfig", kubeconfig, "--tls-cert", str(cert), "--tls-key", str(key),
                          env={"PORT": "0"}) as (url, _):
        assert url.startswith("https://")
        wait_ready(url, verify=False)
        assert httpx.get(url + "/version", verify=False).json() == {"version": "0.1.0"}


def test_config_from_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PORT", "12345")
    config = parse_config(["--unit", "MiB", "--policy", "spread", "--tie-seed", "7", "--log-level", "debug"])
    assert (config.port, config.unit, config.policy, config.tie_seed, config.log_level) == (
        12345, MemoryUnit.MiB, "spread", 7, "DEBUG")
    assert parse_config(["--port", "8080"]).port == 8080
    monkeypatch.delenv("PORT")
    assert parse_config([]).port == 39999


@pytest.mark.parametrize(("argv", "env", "message"), [
    (["--tls-cert", "/etc/hostname"], {}, "--tls-cert and --tls-key go together"),
    ([], {"PORT": "http"}, "PORT='http' is not a port number"),
    (["--port", "70000"], {}, "Port 70000 is out of range"),
    (["--policy", "random"], {}, "Unknown placement policy 'random'"),
    (["--kubeconfig", "/nonexistent/config"], {}, "/nonexistent/config does not exist"),
    (["--bind-timeout", "0"], {}, "--bind-timeout 0 must be above 0 and at most 60 seconds"),
    ([], {"GPUSHARE_BIND_TIMEOUT": "soon"}, "GPUSHARE_BIND_TIMEOUT='soon' is not a number"),
    (["--max-concurrent-binds", "0"], {}, "--max-concurrent-binds 0 must be from 1 to 1024"),
    ([], {"GPUSHARE_MAX_BODY_BYTES": "100"}, "--max-body-bytes 100 must be from 65536"),
    (["--gang-timeout", "0"], {}, "--gang-timeout 0 must be above 0 and at most 3600 seconds"),
    ([], {"GPUSHARE_GANG_TIMEOUT": "later"}, "GPUSHARE_GANG_TIMEOUT='later' is not a number"),
    (["--tls-client-names", "kube-scheduler"], {},
     "--tls-client-names narrows the client certificates that --tls-client-ca accepts, so it needs --tls-client-ca"),
    (["--tls-client-names", "kube-scheduler,,x"], {},
     "--tls-client-names 'kube-scheduler,,x' must be a comma-separated list of names of 1 to 253 characters"),
])
def test_bad_config_is_a_sentence(monkeypatch: pytest.MonkeyPatch, argv: list[str], env: dict[str, str],
                                  message: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        parse_config(argv)


def test_the_default_bind_slots_ride_out_an_api_server_stall() -> None:
    # kube-scheduler keeps binding while the API server does not answer: at 300 pods a second, 0.4 s of stall.
    assert parse_config([]).max_binds >= 0.4 * 300


def test_limits_from_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_config([]).bind_timeout_s == 3.0
    monkeypatch.setenv("GPUSHARE_BIND_TIMEOUT", "2.5")
    monkeypatch.setenv("GPUSHARE_MAX_CONCURRENT_BINDS", "8")
    config = parse_config(["--max-body-bytes", "1048576"])
    assert (config.bind_timeout_s, config.max_binds, config.max_body_bytes) == (2.5, 8, 1048576)
    assert parse_config(["--bind-timeout", "4"]).bind_timeout_s == 4.0
    assert parse_config([]).gang_timeout_s == 60.0
    assert parse_config(["--gang-timeout", "90"]).gang_timeout_s == 90.0


def test_bad_config_exits_with_status_2() -> None:
    result = subprocess.run([sys.executable, "-m", "extender", "--policy", "random"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 2
    assert "gpushare-extender: Unknown placement policy 'random'" in result.stderr
