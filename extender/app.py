"""The extender's HTTP app: kube-scheduler's verbs, Aliyun's inspect and version, health and metrics."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from extender.binder import Binder
from extender.config import ExtenderConfig
from extender.forward import FORWARDED_BY_HEADER, BindForwarder
from extender.inspect import inspect_nodes
from extender.leader import LeaderElector
from extender.metrics import ExtenderMetrics
from extender.placement import PolicyBook, RequestCache
from extender.verbs import Verbs
from extender.wire import BadRequest, parse_binding_args, parse_extender_args
from gpushare import __version__
from gpushare.cache.state import ClusterCache
from gpushare.kube.api import Kube
from gpushare.kube.watch import ClusterWatch
from gpushare.policies.workload import load_workload

PREFIX = "/gpushare-scheduler"


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


async def _freeze_when_synced(watch: ClusterWatch) -> None:
    """Exempt the first list's objects from the cyclic garbage collector.

    At thousands of nodes the cache holds hundreds of thousands of long-lived objects; every full
    collection would walk them all, a pause of many milliseconds in the middle of some filter request.
    """
    while not watch.synced:
        await asyncio.sleep(0.1)
    gc.collect()
    gc.freeze()


def create_app(config: ExtenderConfig, kube: Kube) -> FastAPI:
    """Build the extender around one API server's ``Kube``; the watch starts with the app."""
    cache = ClusterCache(config.unit)
    watch = ClusterWatch(kube.nodes.list_call, kube.pods.list_call, cache)
    book = PolicyBook(config.policy, load_workload(config.workload_seed) if config.workload_seed else None)
    requests = RequestCache()
    verbs = Verbs(cache, book, requests, config.tie_seed)
    binder = Binder(kube.pods, cache, book, requests)
    elector: LeaderElector | None = None
    forwarder: BindForwarder | None = None
    if config.leader is not None:
        # A replica contends only once its cache holds the whole cluster, so a new leader never binds from an
        # empty cache; the previous leader's placements are in pod annotations, written before each Binding.
        elector = LeaderElector(kube.leases, config.leader, lambda: watch.synced)
        forwarder = BindForwarder(config.leader.identity, config.peer_ca)
    metrics = ExtenderMetrics(cache, lambda: elector is None or elector.is_leader)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        watch.start()
        freezer = asyncio.create_task(_freeze_when_synced(watch))
        if elector is not None and forwarder is not None:
            await forwarder.open()
            elector.start()
        try:
            yield
        finally:
            freezer.cancel()
            if elector is not None and forwarder is not None:
                # Requests have finished by now: hand the lease back so that a peer binds at once.
                await run_in_threadpool(elector.stop)
                await forwarder.close()
            await run_in_threadpool(watch.stop)

    app = FastAPI(title="gpushare scheduler extender", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None)

    def bad_request(verb: str, exc: BadRequest) -> Response:
        metrics.count(verb, 400)
        return _json({"Error": str(exc)}, 400)

    @app.post(PREFIX + "/filter")
    async def filter_verb(request: Request) -> Response:
        with metrics.timed("filter"):
            try:
                response = _json(verbs.filter(parse_extender_args(await request.body())))
            except BadRequest as exc:
                return bad_request("filter", exc)
            metrics.count("filter", 200)
            return response

    @app.post(PREFIX + "/prioritize")
    async def prioritize_verb(request: Request) -> Response:
        with metrics.timed("prioritize"):
            try:
                # Scoring thousands of nodes takes tens of milliseconds: off the event loop, so that filters
                # and binds in flight are not held up behind it.
                args = parse_extender_args(await request.body())
                response = _json(await run_in_threadpool(verbs.prioritize, args))
            except BadRequest as exc:
                return bad_request("prioritize", exc)
            metrics.count("prioritize", 200)
            return response

    @app.post(PREFIX + "/bind")
    async def bind_verb(request: Request) -> Response:
        with metrics.timed("bind"):
            body = await request.body()
            try:
                args = parse_binding_args(body)
            except BadRequest as exc:
                return bad_request("bind", exc)
            if elector is not None and forwarder is not None and not elector.is_leader:
                answer = await forwarder.forward(body, args, elector.view(), request.headers.get(FORWARDED_BY_HEADER))
                metrics.count("bind", answer.status)
                return Response(answer.body, status_code=answer.status, media_type="application/json")
            outcome = await run_in_threadpool(binder.bind, args)
            metrics.binds.labels("failed" if outcome.error else "bound").inc()
            metrics.bind_conflicts.inc(outcome.conflicts)
            metrics.count("bind", 200)
            return _json({"Error": outcome.error})

    @app.get(PREFIX + "/inspect")
    def inspect_all() -> Response:
        return _json({"nodes": inspect_nodes(cache), "error": ""})

    @app.get(PREFIX + "/inspect/{node}")
    def inspect_node(node: str) -> Response:
        nodes = inspect_nodes(cache, node)
        if not nodes:
            return _json({"nodes": [], "error": f"Node {node!r} is not in the gpushare extender's cache; check the "
                                                "name with 'kubectl get nodes'."}, 404)
        return _json({"nodes": nodes, "error": ""})

    @app.get("/version")
    def version() -> Response:
        return _json({"version": __version__})

    @app.get("/leader")
    def leader() -> Response:
        if elector is None:
            return _json({"leaderElection": False, "leader": True, "identity": "", "holder": "", "leaderURL": ""})
        view = elector.view()
        return _json({"leaderElection": True, "leader": view.is_leader, "identity": elector.settings.identity,
                      "holder": view.holder, "leaderURL": view.leader_url})

    @app.get("/healthz")
    def healthz() -> Response:
        return Response("ok\n", media_type="text/plain")

    @app.get("/readyz")
    def readyz() -> Response:
        if watch.synced:
            return Response("ok\n", media_type="text/plain")
        return Response("the node and pod caches have not finished their first list yet\n", status_code=503,
                        media_type="text/plain")

    @app.get("/metrics")
    def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
