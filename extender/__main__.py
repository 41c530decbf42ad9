"""``gpushare-extender``: serve the scheduler extender."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import uvicorn
from kubernetes import client as kube_client
from kubernetes import config as kube_config

from extender.app import create_app
from extender.config import ConfigError, parse_config
from gpushare import __version__
from gpushare.logs import configure_logging

log = logging.getLogger("extender")


def api_client(kubeconfig: Path | None) -> Any:
    """A kubernetes ApiClient: the given kubeconfig, else the pod's service account, else the default file."""
    if kubeconfig is not None:
        return kube_config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
    try:
        kube_config.load_incluster_config()  # type: ignore[no-untyped-call]
    except kube_config.ConfigException:
        return kube_config.new_client_from_config()  # type: ignore[no-untyped-call]
    return kube_client.ApiClient()


def main(argv: Sequence[str] | None = None) -> None:
    try:
        config = parse_config(argv)
    except ConfigError as exc:
        print(f"gpushare-extender: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    configure_logging(config.log_level)
    try:
        cluster = api_client(config.kubeconfig)
    except kube_config.ConfigException as exc:
        print(f"gpushare-extender: cannot find the cluster: {exc}. Pass --kubeconfig, or run it in a pod with a "
              "service account.", file=sys.stderr)
        raise SystemExit(2) from None
    leader = config.leader
    log.info("starting gpushare extender", extra={
        "version": __version__, "port": config.port, "policy": config.policy, "unit": config.unit.value,
        "workload_seed": str(config.workload_seed) if config.workload_seed else None,
        "lease": f"{leader.namespace}/{leader.name}" if leader else None,
        "identity": leader.identity if leader else None, "advertise_url": leader.advertise_url if leader else None})
    uvicorn.run(create_app(config, cluster), host=config.host, port=config.port,
                ssl_certfile=str(config.tls_cert) if config.tls_cert else None,
                ssl_keyfile=str(config.tls_key) if config.tls_key else None,
                log_config=None, access_log=False)


if __name__ == "__main__":
    main()
