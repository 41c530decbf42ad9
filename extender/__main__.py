"""``gpushare-extender``: serve the scheduler extender."""

from __future__ import annotations

import asyncio
import logging
import ssl
import sys
from collections.abc import Callable, Sequence

import uvicorn

from extender.app import HealthOnly, create_app
from extender.config import ConfigError, ExtenderConfig, parse_config
from extender.tls import ServerTLS, expiration_fields
from gpushare import __version__
from gpushare.kube.client import KubeConfigError, connect
from gpushare.logs import configure_logging
from gpushare.native import compiled

log = logging.getLogger("extender")

# Connections to the API server besides the binds': the watches (nodes, pods, PodDisruptionBudgets, PodGroups), the
# leader election's calls, and a gang's reads of its PodGroup.
OTHER_CONNECTIONS = 8

# kube-scheduler's extender client closes a connection idle for 90 s (client-go's transport defaults take Go's
# DefaultTransport.IdleConnTimeout); uvicorn's own default closes one after 5 s. The client must be the one to
# close: a server's close that crosses a filter or bind being written fails it (Go retries a POST only when none
# of it was written), which sends the pod to backoff, and over HTTPS every pod after a quiet spell of 5 to 90 s
# would pay a full handshake on kube-scheduler's serial path (docs/extender.md, "Mutual TLS and connections").
KEEP_ALIVE_S = 120


def main(argv: Sequence[str] | None = None) -> None:
    try:
        config = parse_config(argv)
    except ConfigError as exc:
        print(f"gpushare-extender: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    configure_logging(config.log_level)
    try:
        kube = connect(config.kubeconfig, config.context, connections=config.max_binds + OTHER_CONNECTIONS)
    except KubeConfigError as exc:
        print(f"gpushare-extender: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    leader = config.leader
    loop_factory = _loop_factory()
    compiled_modules = compiled()
    tls = _server_tls(config)
    expiration = tls.expiration() if tls is not None else {}
    log.info("starting gpushare extender", extra={
        "version": __version__, "port": config.port, "policy": config.policy, "unit": config.unit.value,
        "event_loop": "asyncio" if loop_factory is None else "uvloop",
        "workload_seed": str(config.workload_seed) if config.workload_seed else None,
        "lease": f"{leader.namespace}/{leader.name}" if leader else None,
        "identity": leader.identity if leader else None, "advertise_url": leader.advertise_url if leader else None,
        "compiled": compiled_modules, "tls": None if tls is None else "mutual" if tls.mutual else "server",
        **expiration_fields(expiration)})
    if not compiled_modules:
        log.warning("the placement policies run as Python, not compiled: each filter costs about a third more CPU. "
                    "The install found no C compiler; install gcc and the Python headers, then install gpushare again")
    if tls is None or not tls.mutual:
        log.warning("INSECURE: the extender accepts filter, prioritize, bind and inspect from anyone who can reach "
                    "it, and a bind moves any pending pod onto any node; give --tls-client-ca (with --tls-cert and "
                    "--tls-key) so that only kube-scheduler's client certificate is accepted (docs/install.md)")
    app = create_app(config, kube, tls)
    main_server = uvicorn.Server(uvicorn.Config(
        app, host=config.host, port=config.port, log_config=None, access_log=False, timeout_keep_alive=KEEP_ALIVE_S,
        # Called once, at start; the context then follows the files itself (extender/tls.py).
        ssl_context_factory=(lambda _config, _default: tls.context) if tls is not None else None))
    health_server = None
    if config.health_port is not None:
        health_server = uvicorn.Server(uvicorn.Config(HealthOnly(app), host=config.host, port=config.health_port,
                                                      lifespan="off", log_config=None, access_log=False))
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_serve(main_server, health_server))


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (everywhere but Windows), else asyncio's own (``None``).

    Every GPU pod costs kube-scheduler a filter round trip on its serial path, and the extender's event loop
    reads, dispatches and answers it: at kube-scheduler's pace uvloop cut that round trip by 0.1 ms and the
    extender's CPU per pod by 4% (docs/throughput-history.md, round 7).
    """
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _server_tls(config: ExtenderConfig) -> ServerTLS | None:
    if config.tls_cert is None or config.tls_key is None:
        return None
    try:
        return ServerTLS(config.tls_cert, config.tls_key, config.tls_client_ca, config.tls_client_names)
    except (OSError, ValueError, ssl.SSLError) as exc:
        print(f"gpushare-extender: could not load --tls-cert {config.tls_cert}, --tls-key {config.tls_key} or "
              f"--tls-client-ca {config.tls_client_ca}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


async def _serve(main_server: uvicorn.Server, health_server: uvicorn.Server | None) -> None:
    """Serve the main listener and, beside it on the same event loop, the health listener.

    Health stays on the loop that serves filter and bind, so a stuck loop fails the liveness probe. Each
    server takes SIGTERM while it serves and hands it on to the one that took it before: the health
    listener (started second) stops first, then the main one drains its requests and runs the app's shutdown.
    """
    if health_server is None:
        await main_server.serve()
        return
    main_task = asyncio.create_task(main_server.serve())
    await asyncio.sleep(0)  # the main server takes the signals first
    health_task = asyncio.create_task(health_server.serve())
    # Either one stopping (a signal, a port in use, the app failing to start) stops the other.
    await asyncio.wait({main_task, health_task}, return_when=asyncio.FIRST_COMPLETED)
    main_server.should_exit = health_server.should_exit = True
    await asyncio.gather(main_task, health_task)


if __name__ == "__main__":
    main()
