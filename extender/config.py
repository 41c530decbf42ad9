"""The extender's settings, from command-line flags with environment fallbacks."""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TypeVar

from extender.binder import DEFAULT_BUDGET_S
from extender.gang import DEFAULT_GANG_TIMEOUT_S
from extender.leader import DEFAULT_LEASE_DURATION_S, DEFAULT_LEASE_NAME, DEFAULT_RENEW_PERIOD_S, LeaseSettings
from gpushare.contract import MemoryUnit
from gpushare.logs import LEVELS, clip
from gpushare.policies import DEFAULT_POLICY, policy_names
from gpushare.policies.workload import load_workload

N = TypeVar("N", int, float)

DEFAULT_PORT = 39999
# Binds in flight at once; more are answered at once with an Error (kube-scheduler retries them, after a backoff).
# Enough to ride out an API server that stalls: kube-scheduler keeps sending binds meanwhile, and at 300 pods a
# second 32 slots were full after 0.11 s (the local API server stalled 0.23 s in a benchmark, failing 52 of 8,000
# binds; none with 128). A thread is started only when every one is busy.
DEFAULT_MAX_BINDS = 128
# Large enough for a v1.NodeList of 15,000 real-sized nodes (about 18 KB each with the 50 images the kubelet
# reports: 260 MiB) when kube-scheduler runs with nodeCacheCapable: false and percentageOfNodesToScore: 100.
# With nodeCacheCapable: true (the chart's configuration) a body is a pod and names, and the chart sets 16 MiB.
DEFAULT_MAX_BODY_BYTES = 320 * 2**20
# Seconds a bind's budget may be set to at most: kube-scheduler's httpTimeout is rarely above 30 s.
MAX_BUDGET_S = 60.0
# A gang's plan holds GPUs idle while it waits for its binds: an hour is already far too long.
MAX_GANG_TIMEOUT_S = 3600.0


class NodeChoice(StrEnum):
    """Which verb decides a GPU pod's node among those it fits."""

    FILTER = "filter"  # filter passes only the policy's favourite; kube-scheduler then skips prioritize
    PRIORITIZE = "prioritize"  # filter passes every node that fits; prioritize ranks them among kube-scheduler's scores


class ConfigError(ValueError):
    """A setting the extender cannot start with; the text says which and how to fix it."""


@dataclass(frozen=True)
class ExtenderConfig:
    host: str = "0.0.0.0"  # kube-scheduler reaches the extender over the pod network
    port: int = DEFAULT_PORT
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None  # None: any client may call (insecure, warned about at start)
    tls_client_names: frozenset[str] = frozenset()  # empty: any certificate the client CA signed
    health_port: int | None = None  # plain-HTTP listener for /healthz, /readyz and /metrics only
    unit: MemoryUnit = MemoryUnit.GiB
    log_level: str = "INFO"
    policy: str = DEFAULT_POLICY
    tie_seed: int = 0
    node_choice: NodeChoice = NodeChoice.FILTER
    kubeconfig: Path | None = None
    context: str | None = None  # a context of the kubeconfig; None: its current-context
    leader: LeaseSettings | None = None  # None: a single replica, which binds itself
    peer_ca: Path | None = None
    workload_seed: Path | None = None  # a seed file for the learning policies' workload distribution
    bind_timeout_s: float = DEFAULT_BUDGET_S  # each bind's time budget, every API call included
    max_binds: int = DEFAULT_MAX_BINDS  # binds in flight at once
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # the largest request body read
    gang_timeout_s: float = DEFAULT_GANG_TIMEOUT_S  # how long a gang plan waits for its binds, unless its PodGroup says


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpushare-extender",
        description="kube-scheduler HTTP extender that shares GPUs between pods by memory.")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=None,
                        help=f"port to listen on (default: $PORT, else {DEFAULT_PORT})")
    parser.add_argument("--tls-cert", type=Path, help="serve HTTPS with this certificate (kube-scheduler enableHTTPS)")
    parser.add_argument("--tls-key", type=Path, help="private key of --tls-cert")
    parser.add_argument("--tls-client-ca", type=Path, default=_env_path("GPUSHARE_TLS_CLIENT_CA"),
                        help="accept only connections whose client certificate this CA signed, such as "
                             "kube-scheduler's tlsConfig certFile (default: $GPUSHARE_TLS_CLIENT_CA; without it "
                             "anyone who reaches the extender may bind pods)")
    parser.add_argument("--tls-client-names", default="",
                        help="comma-separated: accept only client certificates that name one of these as their "
                             "common name or a DNS name, such as kube-scheduler (default: any certificate "
                             "--tls-client-ca signed); the replicas' own --tls-cert is accepted too, for forwarded "
                             "binds")
    parser.add_argument("--health-port", type=int, default=None,
                        help="also serve /healthz, /readyz and /metrics, and nothing else, over plain HTTP on this "
                             "port, for probes and Prometheus that hold no client certificate (default: "
                             "$GPUSHARE_HEALTH_PORT, else none)")
    parser.add_argument("--unit", choices=[u.value for u in MemoryUnit], default=os.environ.get("GPU_MEM_UNIT", "GiB"),
                        help="unit of one aliyun.com/gpu-mem device, as the device plugin advertises it "
                             "(default: $GPU_MEM_UNIT, else GiB)")
    parser.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "INFO"), type=str.upper, choices=LEVELS,
                        help="log level (default: $LOG_LEVEL, else INFO)")
    parser.add_argument("--policy", default=os.environ.get("GPUSHARE_POLICY", DEFAULT_POLICY),
                        help=f"placement policy for pods that do not name one (default {DEFAULT_POLICY})")
    parser.add_argument("--tie-seed", type=int, default=0, help="seed that breaks ties between equal nodes")
    parser.add_argument("--node-choice", choices=[c.value for c in NodeChoice],
                        default=os.environ.get("GPUSHARE_NODE_CHOICE", NodeChoice.FILTER.value),
                        help="filter: filter passes only the node the policy places the pod on, so kube-scheduler "
                             "binds there and skips prioritize (one call per pod instead of two); prioritize: filter "
                             "passes every node that fits and prioritize ranks them, weighed with kube-scheduler's "
                             "own scores (default: $GPUSHARE_NODE_CHOICE, else filter)")
    parser.add_argument("--kubeconfig", type=Path, default=None,
                        help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else the pod's service "
                             "account)")
    parser.add_argument("--context", default=None, help="kubeconfig context to use (default: its current-context)")
    parser.add_argument("--workload-seed", type=Path, default=None,
                        help="YAML or JSON file of task shapes and weights (weights count as pods) that the "
                             "learning policies (fgd, fgd-lookahead, fgd-scarcity) start from; see docs/policies.md")
    limits = parser.add_argument_group("limits")
    limits.add_argument("--bind-timeout", type=float, default=None, metavar="SECONDS",
                        help=f"time budget of one bind, every API call included; keep it at least 1 s below "
                             f"kube-scheduler's httpTimeout (default: $GPUSHARE_BIND_TIMEOUT, else "
                             f"{DEFAULT_BUDGET_S:g})")
    limits.add_argument("--max-concurrent-binds", type=int, default=None, metavar="N",
                        help=f"binds in flight at once; more are answered at once with an error and retried by "
                             f"kube-scheduler (default: $GPUSHARE_MAX_CONCURRENT_BINDS, else {DEFAULT_MAX_BINDS})")
    limits.add_argument("--max-body-bytes", type=int, default=None, metavar="BYTES",
                        help=f"largest request body accepted (default: $GPUSHARE_MAX_BODY_BYTES, else "
                             f"{DEFAULT_MAX_BODY_BYTES}, a NodeList of 15,000 nodes)")
    limits.add_argument("--gang-timeout", type=float, default=None, metavar="SECONDS",
                        help=f"how long the GPUs a gang's plan holds wait for all its members to bind before they are "
                             f"released, for gangs whose PodGroup sets no scheduleTimeoutSeconds (default: "
                             f"$GPUSHARE_GANG_TIMEOUT, else {DEFAULT_GANG_TIMEOUT_S:g})")
    ha = parser.add_argument_group("high availability (several replicas, one of which binds)")
    ha.add_argument("--leader-elect", action="store_true",
                    help="elect one replica to bind through a Lease; the others forward binds to it")
    ha.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE") or "kube-system",
                    help="namespace of the Lease (default: $POD_NAMESPACE, else kube-system)")
    ha.add_argument("--lease-name", default=DEFAULT_LEASE_NAME,
                    help=f"name of the Lease (default {DEFAULT_LEASE_NAME})")
    ha.add_argument("--lease-identity", default=os.environ.get("POD_NAME") or socket.gethostname(),
                    help="this replica's name in the Lease (default: $POD_NAME, else the host name)")
    ha.add_argument("--advertise-url", default="",
                    help="where the other replicas reach this one (default: http(s)://$POD_IP:<port>)")
    ha.add_argument("--lease-duration", type=int, default=DEFAULT_LEASE_DURATION_S,
                    help=f"seconds without renewal after which another replica may take the Lease "
                         f"(default {DEFAULT_LEASE_DURATION_S})")
    ha.add_argument("--lease-renew-period", type=float, default=DEFAULT_RENEW_PERIOD_S,
                    help=f"seconds between the leader's renewals and the followers' reads of the Lease "
                         f"(default {DEFAULT_RENEW_PERIOD_S:g})")
    ha.add_argument("--peer-ca", type=Path, default=None,
                    help="CA bundle that signed the replicas' certificates, to forward binds to the leader over "
                         "HTTPS (default: the system's trust store)")
    return parser


def _advertise_url(args: argparse.Namespace, port: int) -> str:
    if args.advertise_url:
        if not args.advertise_url.startswith(("http://", "https://")):
            raise ConfigError(f"--advertise-url {args.advertise_url!r} must be an http:// or https:// URL, such as "
                              f"http://10.0.0.7:{DEFAULT_PORT}.")
        return str(args.advertise_url)
    if port == 0:
        raise ConfigError("--leader-elect with --port 0 leaves the other replicas no port to reach this one; "
                          "choose a port or pass --advertise-url.")
    host = os.environ.get("POD_IP") or (args.host if args.host not in ("0.0.0.0", "::", "") else socket.gethostname())
    if ":" in host:
        host = f"[{host}]"
    scheme = "https" if args.tls_cert else "http"
    return f"{scheme}://{host}:{port}"


def _lease_settings(args: argparse.Namespace, port: int) -> LeaseSettings | None:
    if not args.leader_elect:
        return None
    if args.lease_duration < 1:
        raise ConfigError(f"--lease-duration {args.lease_duration} must be at least 1 second.")
    if not 0 < args.lease_renew_period * 2 <= args.lease_duration:
        raise ConfigError(f"--lease-renew-period {args.lease_renew_period:g} must be above 0 and at most half of "
                          f"--lease-duration ({args.lease_duration}), so that the leader renews at least twice "
                          "before another replica may take over.")
    for flag, value in (("--lease-namespace", args.lease_namespace), ("--lease-name", args.lease_name),
                        ("--lease-identity", args.lease_identity)):
        if not value:
            raise ConfigError(f"{flag} must not be empty.")
    return LeaseSettings(namespace=args.lease_namespace, name=args.lease_name, identity=args.lease_identity,
                         advertise_url=_advertise_url(args, port), duration_s=args.lease_duration,
                         renew_period_s=args.lease_renew_period)


def parse_config(argv: Sequence[str] | None = None) -> ExtenderConfig:
    args = _parser().parse_args(argv)
    port = args.port
    if port is None:
        raw = os.environ.get("PORT", str(DEFAULT_PORT))
        if not raw.isdigit():
            raise ConfigError(f"PORT={raw!r} is not a port number; set it to an integer such as {DEFAULT_PORT}.")
        port = int(raw)
    if not 0 <= port <= 65535:
        raise ConfigError(f"Port {port} is out of range; use 1 to 65535.")
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together; give both to serve HTTPS, or neither.")
    if args.tls_client_ca is not None and args.tls_cert is None:
        raise ConfigError("--tls-client-ca checks client certificates during the TLS handshake, so it needs "
                          "--tls-cert and --tls-key as well.")
    client_names = _client_names(args.tls_client_names)
    if client_names and args.tls_client_ca is None:
        raise ConfigError("--tls-client-names narrows the client certificates that --tls-client-ca accepts, so it "
                          "needs --tls-client-ca (with --tls-cert and --tls-key) as well.")
    health_port = _number(args.health_port, "--health-port", "GPUSHARE_HEALTH_PORT", -1, int)
    if health_port != -1 and (not 0 <= health_port <= 65535 or (health_port == port and port != 0)):
        raise ConfigError(f"--health-port {health_port} must be from 0 to 65535 and differ from --port ({port}).")
    if args.node_choice not in {c.value for c in NodeChoice}:  # argparse checks the flag, not the environment
        raise ConfigError(f"GPUSHARE_NODE_CHOICE={clip(args.node_choice)} is not a node choice; use "
                          f"{' or '.join(NodeChoice)}.")
    node_choice = NodeChoice(args.node_choice)
    if args.policy not in policy_names():
        raise ConfigError(f"Unknown placement policy {args.policy!r}; use one of {', '.join(policy_names())}.")
    for path in (args.tls_cert, args.tls_key, args.tls_client_ca, args.kubeconfig, args.peer_ca, args.workload_seed):
        if path is not None and not path.is_file():
            raise ConfigError(f"{path} does not exist or is not a file.")
    if args.workload_seed is not None:
        _check_workload_seed(args.workload_seed)
    bind_timeout = _number(args.bind_timeout, "--bind-timeout", "GPUSHARE_BIND_TIMEOUT", DEFAULT_BUDGET_S, float)
    if not 0 < bind_timeout <= MAX_BUDGET_S:
        raise ConfigError(f"--bind-timeout {bind_timeout:g} must be above 0 and at most {MAX_BUDGET_S:g} seconds, and "
                          "at least 1 s below kube-scheduler's httpTimeout.")
    max_binds = _number(args.max_concurrent_binds, "--max-concurrent-binds", "GPUSHARE_MAX_CONCURRENT_BINDS",
                        DEFAULT_MAX_BINDS, int)
    if not 1 <= max_binds <= 1024:
        raise ConfigError(f"--max-concurrent-binds {max_binds} must be from 1 to 1024.")
    max_body = _number(args.max_body_bytes, "--max-body-bytes", "GPUSHARE_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES,
                       int)
    if not 64 * 1024 <= max_body <= 2**32:
        raise ConfigError(f"--max-body-bytes {max_body} must be from 65536 (64 KiB) to 4294967296 (4 GiB).")
    gang_timeout = _number(args.gang_timeout, "--gang-timeout", "GPUSHARE_GANG_TIMEOUT", DEFAULT_GANG_TIMEOUT_S,
                           float)
    if not 0 < gang_timeout <= MAX_GANG_TIMEOUT_S:
        raise ConfigError(f"--gang-timeout {gang_timeout:g} must be above 0 and at most {MAX_GANG_TIMEOUT_S:g} "
                          "seconds.")
    return ExtenderConfig(host=args.host, port=port, bind_timeout_s=bind_timeout, max_binds=max_binds,
                          max_body_bytes=max_body, tls_cert=args.tls_cert, tls_key=args.tls_key,
                          tls_client_ca=args.tls_client_ca, tls_client_names=client_names,
                          health_port=None if health_port == -1 else health_port,
                          unit=MemoryUnit(args.unit), log_level=args.log_level, policy=args.policy,
                          tie_seed=args.tie_seed, node_choice=node_choice, kubeconfig=args.kubeconfig,
                          context=args.context, leader=_lease_settings(args, port),
                          peer_ca=args.peer_ca, workload_seed=args.workload_seed, gang_timeout_s=gang_timeout)


def _client_names(raw: str) -> frozenset[str]:
    if not raw:
        return frozenset()
    names = [name.strip() for name in raw.split(",")]
    if not all(0 < len(name) <= 253 for name in names):
        raise ConfigError(f"--tls-client-names {clip(raw)} must be a comma-separated list of names of 1 to 253 "
                          "characters each, such as kube-scheduler or kube-scheduler,gpushare-scheduler.")
    return frozenset(names)


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name, "").strip()
    return Path(value) if value else None


def _number(flag_value: N | None, flag: str, env: str, default: N, kind: type[N]) -> N:
    """The flag's value, else the environment variable's, else ``default``; a sentence for a non-number."""
    if flag_value is not None:
        return flag_value
    raw = os.environ.get(env)
    if raw is None or not raw.strip():
        return default
    try:
        return kind(raw)
    except ValueError:
        raise ConfigError(f"{env}={clip(raw)} is not a number; set it like {flag}, e.g. {default}.") from None


def _check_workload_seed(path: Path) -> None:
    """Read the seed file once at startup, so that a bad one stops the extender with a sentence."""
    try:
        weights = load_workload(path)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if sum(weights.values()) <= 0:
        raise ConfigError(f"The workload seed {path} gives every shape weight 0; give at least one a positive "
                          "weight (the number of pods of that shape).")
