"""``gpushare-extender``: serve the scheduler extender."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import uvicorn

from extender.app import create_app
from extender.config import ConfigError, parse_config
from gpushare import __version__
from gpushare.kube.client import KubeConfigError, connect
from gpushare.logs import configure_logging

log = logging.getLogger("extender")


def main(argv: Sequence[str] | None = None) -> None:
    try:
        config = parse_config(argv)
    except ConfigError as exc:
        print(f"gpushare-extender: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    configure_logging(config.log_level)
    try:
        kube = connect(config.kubeconfig, config.context)
    except KubeConfigError as exc:
        print(f"gpushare-extender: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    leader = config.leader
    log.info("starting gpushare extender", extra={
        "version": __version__, "port": config.port, "policy": config.policy, "unit": config.unit.value,
        "workload_seed": str(config.workload_seed) if config.workload_seed else None,
        "lease": f"{leader.namespace}/{leader.name}" if leader else None,
        "identity": leader.identity if leader else None, "advertise_url": leader.advertise_url if leader else None})
    uvicorn.run(create_app(config, kube), host=config.host, port=config.port,
                ssl_certfile=str(config.tls_cert) if config.tls_cert else None,
                ssl_keyfile=str(config.tls_key) if config.tls_key else None,
                log_config=None, access_log=False)


if __name__ == "__main__":
    main()
