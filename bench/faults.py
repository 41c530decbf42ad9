"""Fault injection against real processes: the local API server and the extender, each in its own process.

    .venv/bin/python -m bench.faults [--pods 50] [--freeze-s 12] [--budget-s 4] [--hostile 1000]

Scenarios (each prints a row; ``tests/test_faults.py`` runs short versions of the same functions in CI):

* **freeze**: ``--pods`` binds in flight, then the API server is stopped with SIGSTOP for ``--freeze-s`` and
  continued. Every bind must answer within its budget; binds that failed are retried afterwards, as
  kube-scheduler retries them.
* **restart-empty**: the API server is killed (SIGKILL) and an empty one (the same nodes, no pods) starts on the
  same address; the extender must notice, drop what it held and place pods again.
* **kill-extender**: the extender is killed (SIGKILL) in the middle of a burst of binds and started again; it
  rebuilds its state from the pods' annotations and the retried binds go through.
* **hostile**: a flood of malformed and hostile binds alongside ordinary traffic.

Throughout, ``/healthz`` and ``/readyz`` are polled every 20 ms: the slowest answer is reported. Afterwards the
extender's per-GPU view must equal what the pods' annotations say, and no GPU may be over capacity.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml
from tabulate import tabulate

from gpushare.contract import NodeInfo, PodInfo
from gpushare.kube.convert import node_info, pod_info
from inspect_cli.report import node_report

PREFIX = "/gpushare-scheduler"
NODES = 4
GPUS = 4
GPU_MIB = 16384
START_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cluster_file(folder: Path) -> Path:
    path = folder / "cluster.yaml"
    gpus = [{"model": "Tesla-V100-SXM2-16GB", "memoryMiB": GPU_MIB}] * GPUS
    path.write_text(yaml.safe_dump({"nodes": [{"name": f"node-{i}", "gpus": gpus} for i in range(NODES)]}))
    return path


def stop_process(pid: int, timeout_s: float = 5.0) -> None:
    """SIGSTOP, and wait until the kernel shows the process stopped: delivery is asynchronous, and on a loaded
    machine a request sent right after the signal could otherwise still be answered."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        if time.monotonic() > deadline:
            raise RuntimeError(f"process {pid} did not stop within {timeout_s:g} s of SIGSTOP")
        time.sleep(0.001)


class Process:
    """A component in its own process, its output in a log file."""

    def __init__(self, command: list[str], log: Path) -> None:
        self.command = command
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        with self.log.open("a") as out:
            self.process = subprocess.Popen(self.command, stdout=out, stderr=out, start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def signal(self, signum: int) -> None:
        if signum == signal.SIGSTOP:
            stop_process(self.pid)
        else:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"{self.command[2]} exited with {self.process.returncode}; its log {self.log} ends "
                               f"with: {self.log.read_text()[-1500:]}")


@dataclass
class Rig:
    """The local API server and the extender as processes, and HTTP clients for both."""

    folder: Path
    budget_s: float
    api_port: int = field(default_factory=free_port)
    extender_port: int = field(default_factory=free_port)
    api: Process | None = None
    extender: Process | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def extender_url(self) -> str:
        return f"http://127.0.0.1:{self.extender_port}"

    @property
    def kubeconfig(self) -> Path:
        return self.folder / "kubeconfig"

    def start_api(self) -> None:
        self.api = Process([sys.executable, "-m", "gpushare.localcluster", "--cluster", str(cluster_file(self.folder)),
                            "--port", str(self.api_port), "--kubeconfig", str(self.kubeconfig), "--log-level",
                            "WARNING"], self.folder / "api.log").start()
        wait(lambda: _answers(self.api_url + "/version"), "the API server to answer", self.api)

    def start_extender(self) -> None:
        self.extender = Process([sys.executable, "-m", "extender", "--host", "127.0.0.1", "--port",
                                 str(self.extender_port), "--kubeconfig", str(self.kubeconfig), "--policy", "binpack",
                                 "--bind-timeout", str(self.budget_s), "--log-level", "WARNING"],
                                self.folder / "extender.log").start()
        wait(lambda: _answers(self.extender_url + "/readyz"), "the extender to be ready", self.extender)

    def stop(self) -> None:
        for process in (self.extender, self.api):
            if process is not None:
                process.stop()

    # -- the API, read directly --------------------------------------------------------------------------

    def pods(self) -> list[PodInfo]:
        body = httpx.get(self.api_url + "/api/v1/pods", timeout=10).json()
        return [pod_info(p) for p in body["items"]]

    def nodes(self) -> list[NodeInfo]:
        body = httpx.get(self.api_url + "/api/v1/nodes", timeout=10).json()
        return [node_info(n) for n in body["items"]]

    def create_pods(self, prefix: str, count: int, units: int = 4) -> list[dict[str, Any]]:
        created = []
        with httpx.Client(base_url=self.api_url, timeout=10) as http:
            for i in range(count):
                body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{prefix}-{i:03d}",
                                                                        "namespace": "default"},
                        "spec": {"containers": [{"name": "main", "image": "registry.local/task:1", "resources": {
                            "limits": {"aliyun.com/gpu-mem": str(units)}}}]}}
                response = http.post("/api/v1/namespaces/default/pods", json=body)
                response.raise_for_status()
                created.append(response.json())
        return created


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def wait(condition: Callable[[], bool], what: str, process: Process | None = None,
         timeout_s: float = START_TIMEOUT_S) -> float:
    started = time.monotonic()
    while not condition():
        if process is not None:
            process.check_alive()
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - started


class HealthProbe:
    """Polls /healthz and /readyz every 20 ms in a thread; remembers the slowest answer and every failure."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.slowest_ms = 0.0
        self.failures: list[str] = []
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=2) as http:
            while not self._stop.is_set():
                for path in ("/healthz", "/readyz"):
                    started = time.perf_counter()
                    try:
                        status = http.get(self.url + path).status_code
                    except httpx.HTTPError as exc:
                        status, detail = 0, type(exc).__name__
                    else:
                        detail = str(status)
                    elapsed = 1000 * (time.perf_counter() - started)
                    self.polls += 1
                    self.slowest_ms = max(self.slowest_ms, elapsed)
                    if path == "/healthz" and status != 200:
                        self.failures.append(f"{path}: {detail}")
                self._stop.wait(0.02)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@dataclass(frozen=True, slots=True)
class BindAnswer:
    pod: str
    seconds: float
    error: str


def bind_all(rig: Rig, pods: Sequence[dict[str, Any]], node_of: Callable[[int], str],
             fault: Callable[[], None] | None = None) -> list[BindAnswer]:
    """Filter each pod onto its node, then send every bind at once, as kube-scheduler's bind goroutines do;
    ``fault`` is injected as soon as the first bind is answered, while others are still in flight. The second
    half of the binds is sent only once the fault is in: on a busy machine the first half can all be answered
    before the fault lands, and a scenario that met no fault would prove nothing."""
    answered = threading.Event()
    injected = threading.Event()

    def inject() -> None:
        answered.wait()
        if fault is not None:
            fault()
        injected.set()

    with httpx.Client(base_url=rig.extender_url + PREFIX, timeout=60) as http:
        for i, pod in enumerate(pods):
            http.post("/filter", content=orjson.dumps({"Pod": pod, "NodeNames": [node_of(i)]}))
        injector = threading.Thread(target=inject, name="fault") if fault is not None else None

        def bind(item: tuple[int, dict[str, Any]]) -> BindAnswer:
            i, pod = item
            meta = pod["metadata"]
            if injector is not None and i >= (len(pods) + 1) // 2:
                injected.wait()
            started = time.perf_counter()
            try:
                response = http.post("/bind", content=orjson.dumps({
                    "PodName": meta["name"], "PodNamespace": "default", "PodUID": meta["uid"], "Node": node_of(i)}))
                error = str(response.json().get("Error", "")) if response.status_code == 200 else (
                    f"HTTP {response.status_code}")
            except httpx.HTTPError as exc:
                error = f"no answer: {type(exc).__name__}"
            answered.set()
            return BindAnswer(meta["name"], time.perf_counter() - started, error)

        with ThreadPoolExecutor(len(pods) or 1) as pool:
            if injector is not None:
                injector.start()
            answers = list(pool.map(bind, enumerate(pods)))
        answered.set()  # no pods, no answer: the fault still comes, so that the scenario goes on
        if injector is not None:
            injector.join()
        return answers


def retry_unbound(rig: Rig, pods: Sequence[dict[str, Any]], node_of: Callable[[int], str], rounds: int = 5) -> int:
    """Bind again every pod the API does not show bound, as kube-scheduler retries after backoff, until all are
    bound (a round can meet the concurrency limit again); how many pods needed a retry."""
    retried: set[str] = set()
    for _ in range(rounds):
        bound = {p.name for p in rig.pods() if p.node_name}
        missing = [(i, p) for i, p in enumerate(pods) if p["metadata"]["name"] not in bound]
        if not missing:
            return len(retried)
        retried.update(p["metadata"]["name"] for _, p in missing)
        fresh = {p["metadata"]["name"]: p for p in httpx.get(rig.api_url + "/api/v1/namespaces/default/pods",
                                                               timeout=10).json()["items"]}
        answers = bind_all(rig, [fresh[p["metadata"]["name"]] for _, p in missing],
                           lambda k, missing=missing: node_of(missing[k][0]))  # type: ignore[misc]
        failed = [a for a in answers if a.error and LIMIT_REFUSAL not in a.error]
        if failed:
            raise AssertionError(f"{len(failed)} retried binds failed, e.g. {failed[0]}")
    raise AssertionError(f"pods were still unbound after {rounds} rounds of retries")


def consistency(rig: Rig, timeout_s: float = 15.0) -> None:
    """The extender's per-GPU view equals the pods' annotations, and no GPU is over capacity.

    The extender learns of the last binds through its watch, so the views may differ for a moment: the check
    is repeated until they agree or ``timeout_s`` passes.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _compare(rig)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _compare(rig: Rig) -> None:
    pods = rig.pods()
    view = {n["name"]: n for n in httpx.get(rig.extender_url + PREFIX + "/inspect", timeout=10).json()["nodes"]}
    for node in rig.nodes():
        report = node_report(node, pods)
        from_annotations = {g.index: g.allocated for g in report.gpus}
        extender = {d["id"]: d["usedGPU"] for d in view[node.name]["devs"]}
        if from_annotations != extender:
            raise AssertionError(f"node {node.name}: the extender holds {extender}, the annotations say "
                                 f"{from_annotations}")
        over = [g.index for g in report.gpus if g.allocated > g.total]
        if over:
            raise AssertionError(f"node {node.name}: GPU(s) {over} are over capacity")


LIMIT_REFUSAL = "binds are already in flight"


@dataclass(frozen=True, slots=True)
class Outcome:
    scenario: str
    binds: int
    slowest_bind_s: float
    failed: int
    """Binds answered with an Error, those refused at once at the concurrency limit included."""
    refused_at_limit: int
    retried: int
    recovery_s: float
    slowest_health_ms: float
    health_failures: int


def refused(answers: Sequence[BindAnswer]) -> int:
    return sum(1 for a in answers if LIMIT_REFUSAL in a.error)


def spread(i: int) -> str:
    return f"node-{i % NODES}"


def freeze(rig: Rig, pods: int, freeze_s: float) -> Outcome:
    created = rig.create_pods("frozen", pods)
    assert rig.api is not None
    api = rig.api
    with HealthProbe(rig.extender_url) as probe:
        frozen_at = 0.0

        def freeze_api() -> None:
            nonlocal frozen_at
            api.signal(signal.SIGSTOP)
            frozen_at = time.monotonic()

        try:
            answers = bind_all(rig, created, spread, fault=freeze_api)
            time.sleep(max(0.0, freeze_s - (time.monotonic() - frozen_at)))
        finally:
            api.signal(signal.SIGCONT)
        started = time.monotonic()
        retried = retry_unbound(rig, created, spread)
        recovery = time.monotonic() - started
    consistency(rig)
    return Outcome("freeze", len(answers), max(a.seconds for a in answers), sum(1 for a in answers if a.error),
                   refused(answers), retried, recovery, probe.slowest_ms, len(probe.failures))


def restart_empty(rig: Rig, pods: int) -> Outcome:
    created = rig.create_pods("before", pods)
    answers = bind_all(rig, created, spread)
    assert rig.api is not None
    with HealthProbe(rig.extender_url) as probe:
        rig.api.kill()
        started = time.monotonic()
        rig.start_api()

        def forgotten() -> bool:
            # The new server holds no pods: the extender has followed it once it holds no GPU memory either.
            view = httpx.get(rig.extender_url + PREFIX + "/inspect", timeout=5).json()["nodes"]
            return bool(view) and all(n["usedGPU"] == 0 for n in view)

        # Recovery: from the kill until the extender's cache is the new server's (its watch lists again).
        wait(forgotten, "the extender to follow the new API server", timeout_s=60)
        recovery = time.monotonic() - started
        after = rig.create_pods("after", pods)
        answers += bind_all(rig, after, spread)
        retried = retry_unbound(rig, after, spread)
    consistency(rig)
    return Outcome("restart-empty", len(answers), max(a.seconds for a in answers),
                   sum(1 for a in answers if a.error), refused(answers), retried, recovery, probe.slowest_ms,
                   len(probe.failures))


def kill_extender(rig: Rig, pods: int) -> Outcome:
    created = rig.create_pods("burst", pods)
    assert rig.extender is not None
    answers = bind_all(rig, created, spread, fault=rig.extender.kill)
    started = time.monotonic()
    rig.start_extender()
    with HealthProbe(rig.extender_url) as probe:
        retried = retry_unbound(rig, created, spread)
    recovery = time.monotonic() - started
    consistency(rig)
    return Outcome("kill-extender", len(answers), max(a.seconds for a in answers),
                   sum(1 for a in answers if a.error), refused(answers), retried, recovery, probe.slowest_ms,
                   len(probe.failures))


def hostile(rig: Rig, count: int) -> Outcome:
    """Malformed and hostile binds, concurrently with ordinary ones that must all succeed."""
    ordinary = rig.create_pods("ordinary", 20, units=1)
    bodies: list[bytes] = []
    for i in range(count):
        kind = i % 5
        if kind == 0:
            bodies.append(orjson.dumps({"PodName": "x" * 100_000, "PodNamespace": "default", "PodUID": "u",
                                        "Node": "node-0"}))
        elif kind == 1:
            bodies.append(orjson.dumps({"PodName": f"ghost-{i}", "PodNamespace": "default", "PodUID": "u",
                                        "Node": "node-0"}))
        elif kind == 2:
            bodies.append(b"{" * 10_000)
        elif kind == 3:
            bodies.append(orjson.dumps({"PodName": ordinary[0]["metadata"]["name"], "PodNamespace": "default",
                                        "PodUID": "not-its-uid", "Node": "node-0"}))
        else:
            bodies.append(orjson.dumps({"PodName": "../../etc", "PodNamespace": "Bad Namespace!", "PodUID": "",
                                        "Node": "node-" + "9" * 5000}))
    slowest = 0.0
    with HealthProbe(rig.extender_url) as probe, httpx.Client(base_url=rig.extender_url + PREFIX,
                                                              timeout=30) as http:

        def send(body: bytes) -> float:
            started = time.perf_counter()
            response = http.post("/bind", content=body)
            if response.status_code >= 500 or len(response.content) > 10_000:
                raise AssertionError(f"a hostile bind got HTTP {response.status_code} with {len(response.content)} "
                                     "bytes")
            return time.perf_counter() - started

        with ThreadPoolExecutor(16) as pool:
            flood = pool.map(send, bodies)
            answers = bind_all(rig, ordinary, spread)
            slowest = max(flood)
    failed = [a for a in answers if a.error]
    consistency(rig)
    return Outcome("hostile", count + len(answers), max(slowest, *(a.seconds for a in answers)), len(failed),
                   refused(answers), 0, 0.0, probe.slowest_ms, len(probe.failures))


@contextmanager
def rig(folder: Path, budget_s: float) -> Iterator[Rig]:
    setup = Rig(folder, budget_s)
    try:
        setup.start_api()
        setup.start_extender()
        yield setup
    finally:
        setup.stop()


def main(argv: Sequence[str] | None = None) -> int:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=50)
    parser.add_argument("--freeze-s", type=float, default=12.0)
    parser.add_argument("--budget-s", type=float, default=4.0)
    parser.add_argument("--hostile", type=int, default=1000)
    args = parser.parse_args(argv)
    rows = []
    scenarios: list[tuple[str, Callable[[Rig], Outcome]]] = [
        ("freeze", lambda r: freeze(r, args.pods, args.freeze_s)),
        ("restart-empty", lambda r: restart_empty(r, args.pods)),
        ("kill-extender", lambda r: kill_extender(r, args.pods)),
        ("hostile", lambda r: hostile(r, args.hostile))]
    with tempfile.TemporaryDirectory(prefix="gpushare-faults-") as tmp:
        for name, run in scenarios:
            print(f"{name} ...", file=sys.stderr, flush=True)
            folder = Path(tmp) / name
            folder.mkdir()
            with rig(folder, args.budget_s) as setup:
                rows.append(run(setup))
    print(tabulate([[o.scenario, o.binds, f"{o.slowest_bind_s:.2f}", o.failed, o.refused_at_limit, o.retried,
                     f"{o.recovery_s:.2f}", f"{o.slowest_health_ms:.0f}", o.health_failures] for o in rows],
                   headers=["scenario", "binds", "slowest bind s", "failed", "of which refused at the limit",
                            "retried and bound", "recovery s", "slowest /healthz|/readyz ms", "health failures"],
                   tablefmt="github"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
