"""The extender's settings, from command-line flags with environment fallbacks."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpushare.contract import MemoryUnit
from gpushare.logs import LEVELS
from gpushare.policies import DEFAULT_POLICY, policy_names

DEFAULT_PORT = 39999


class ConfigError(ValueError):
    """A setting the extender cannot start with; the text says which and how to fix it."""


@dataclass(frozen=True)
class ExtenderConfig:
    host: str = "0.0.0.0"  # kube-scheduler reaches the extender over the pod network
    port: int = DEFAULT_PORT
    tls_cert: Path | None = None
    tls_key: Path | None = None
    unit: MemoryUnit = MemoryUnit.GiB
    log_level: str = "INFO"
    policy: str = DEFAULT_POLICY
    tie_seed: int = 0
    kubeconfig: Path | None = None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpushare-extender",
        description="kube-scheduler HTTP extender that shares GPUs between pods by memory.")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--port", type=int, default=None,
                        help=f"port to listen on (default: $PORT, else {DEFAULT_PORT})")
    parser.add_argument("--tls-cert", type=Path, help="serve HTTPS with this certificate (kube-scheduler enableHTTPS)")
    parser.add_argument("--tls-key", type=Path, help="private key of --tls-cert")
    parser.add_argument("--unit", choices=[u.value for u in MemoryUnit], default=os.environ.get("GPU_MEM_UNIT", "GiB"),
                        help="unit of one aliyun.com/gpu-mem device, as the device plugin advertises it "
                             "(default: $GPU_MEM_UNIT, else GiB)")
    parser.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "INFO"), type=str.upper, choices=LEVELS,
                        help="log level (default: $LOG_LEVEL, else INFO)")
    parser.add_argument("--policy", default=os.environ.get("GPUSHARE_POLICY", DEFAULT_POLICY),
                        help=f"placement policy for pods that do not name one (default {DEFAULT_POLICY})")
    parser.add_argument("--tie-seed", type=int, default=0, help="seed that breaks ties between equal nodes")
    parser.add_argument("--kubeconfig", type=Path, default=None,
                        help="kubeconfig file (default: in-cluster config, else $KUBECONFIG or ~/.kube/config)")
    return parser


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
    if args.policy not in policy_names():
        raise ConfigError(f"Unknown placement policy {args.policy!r}; use one of {', '.join(policy_names())}.")
    for path in (args.tls_cert, args.tls_key, args.kubeconfig):
        if path is not None and not path.is_file():
            raise ConfigError(f"{path} does not exist or is not a file.")
    return ExtenderConfig(host=args.host, port=port, tls_cert=args.tls_cert, tls_key=args.tls_key,
                          unit=MemoryUnit(args.unit), log_level=args.log_level, policy=args.policy,
                          tie_seed=args.tie_seed, kubeconfig=args.kubeconfig)
