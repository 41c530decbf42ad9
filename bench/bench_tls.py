"""What a connection costs the extender: its CPU per call on a kept-alive connection and on a new one, over plain
HTTP and over mutual TLS.

    .venv/bin/python -m bench.bench_tls [--calls 600] [--repeats 3] [--transports http,mtls-ecdsa,mtls-rsa]

kube-scheduler's extender client resumes no TLS session (client-go's TLS configuration has no session cache), so
every connection it opens to an HTTPS extender is a full handshake; and since it keeps two idle connections (Go's
default), binds in flight beside a filter make it open some (``bench.bench_throughput``'s "connections opened to
the extender per pod"). This benchmark prices one: the extender, as its own process on a local cluster of 500
nodes, answers ``--calls`` filters of a pod without GPUs (a 500-name window; the extender passes them all), once
over one kept-alive connection and once on a new connection each, through the scheduler loop's client
(``gpushare.localcluster.extender_client``), per transport as in ``bench.bench_throughput --transports``. Its CPU
per call (from /proc) on each, and their difference: what a connection opened costs it. The transports alternate,
``--repeats`` times, and the table gives each figure's median and range. The client's CPU is the loop's, a Python
client's, and not reported: kube-scheduler's Go client spends its own.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import orjson
from tabulate import tabulate

from bench.bench_throughput import MutualTLS, Transport, cluster, extender, parse_transports, proc_cpu_s
from gpushare.localcluster import LocalCluster
from gpushare.localcluster.extender_client import ExtenderClient

WINDOW = 500
TIMEOUT_S = 10.0


def filter_body(nodes: Sequence[str]) -> bytes:
    """ExtenderArgs for a pod that asks for no GPU, over ``nodes``."""
    pod = {"metadata": {"name": "probe", "namespace": "default", "uid": "probe-uid"},
           "spec": {"containers": [{"name": "main", "image": "registry.local/task:1"}]}}
    return orjson.dumps({"Pod": pod, "NodeNames": list(nodes)})


def cpu_ms_per_call(pid: int, calls: int, call: Callable[[], None]) -> float:
    before = proc_cpu_s(pid)
    for _ in range(calls):
        call()
    return 1000 * (proc_cpu_s(pid) - before) / calls


def measure(url: str, pid: int, tls: MutualTLS | None, body: bytes, calls: int) -> tuple[float, float]:
    """The extender's CPU per call over one kept-alive connection, then on a new connection each."""
    context = tls.loop_context() if tls is not None else None

    def answered(client: ExtenderClient) -> None:
        status, _ = client.post("filter", body)
        if status != 200:
            raise RuntimeError(f"The extender answered a filter with HTTP {status}.")

    kept = ExtenderClient(url, TIMEOUT_S, context)
    answered(kept)  # the connection opened
    try:
        kept_ms = cpu_ms_per_call(pid, calls, lambda: answered(kept))
    finally:
        kept.close()

    def on_a_new_connection() -> None:
        client = ExtenderClient(url, TIMEOUT_S, context)
        try:
            answered(client)
        finally:
            client.close()

    return kept_ms, cpu_ms_per_call(pid, calls, on_a_new_connection)


def spread(samples: Sequence[float]) -> str:
    return f"{statistics.median(samples):.3f} ({min(samples):.3f}-{max(samples):.3f})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=600, help="filters per connection pattern and repeat")
    parser.add_argument("--repeats", type=int, default=3, help="times each transport is measured, alternating")
    parser.add_argument("--transports", type=parse_transports, default=list(Transport),
                        help=f"comma-separated: {', '.join(Transport)} (default all)")
    args = parser.parse_args(argv)
    if args.calls < 1 or args.repeats < 1:
        parser.error(f"--calls and --repeats must be at least 1, not {args.calls} and {args.repeats}.")
    transports: list[Transport] = args.transports
    figures: dict[Transport, list[tuple[float, float]]] = {t: [] for t in transports}
    with tempfile.TemporaryDirectory(prefix="gpushare-tls-") as tmp, \
            LocalCluster(cluster(WINDOW, "uniform", Path())) as local:
        workdir = Path(tmp)
        kubeconfig = local.write_kubeconfig(workdir / "kubeconfig")
        body = filter_body([node.name for node in local.spec.nodes])
        certificates = {t: MutualTLS.make(workdir / f"tls-{t.key}", t.key) for t in transports if t.key is not None}
        for repeat in range(1, args.repeats + 1):
            for transport in transports:
                print(f"repeat {repeat} of {args.repeats}: {transport}", file=sys.stderr, flush=True)
                tls = certificates.get(transport)
                log = workdir / f"extender-{transport}.log"
                with extender(kubeconfig, "binpack", "filter", 0, "uniform", log, tls) as (url, _, pid):
                    time.sleep(1.0)  # past the start-up's own work
                    figures[transport].append(measure(url + "/gpushare-scheduler", pid, tls, body, args.calls))
    rows = []
    for transport, runs in figures.items():
        kept, new = [k for k, _ in runs], [n for _, n in runs]
        rows.append([transport.value, spread(kept), spread(new),
                     spread([n - k for k, n in runs])])
    print(tabulate(rows, headers=["transport", "extender CPU ms a filter, kept-alive connection",
                                  "on a new connection each", "a connection opened costs, ms"], tablefmt="github"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
