"""The extender's HTTP app: kube-scheduler's verbs, Aliyun's inspect and version, health and metrics."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any, cast

import orjson
from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from extender import collector
from extender.binder import Binder, BindOutcome
from extender.config import ExtenderConfig, NodeChoice
from extender.forward import FORWARDED_BY_HEADER, BindForwarder
from extender.gang import COMPONENT as GANG_COMPONENT
from extender.gang import SWEEP_INTERVAL_S, Gangs
from extender.inspect import inspect_nodes
from extender.leader import LeaderElector
from extender.ledger import FilterLedger
from extender.metrics import ExtenderMetrics
from extender.placement import PolicyBook, RequestCache
from extender.preempt import Preempt
from extender.tls import ClientTLS, ServerTLS
from extender.verbs import FILTER_HOLD_S, Verbs
from extender.wire import (
    BadRequest,
    BindingArgs,
    host_priority_list,
    parse_binding_args,
    parse_extender_args,
    parse_preemption_args,
    subdomain_problem,
)
from gpushare import __version__
from gpushare.cache.state import ClusterCache
from gpushare.contract import PodInfo, names_a_gang
from gpushare.kube.api import Kube
from gpushare.kube.watch import ClusterWatch
from gpushare.logs import clip
from gpushare.policies.workload import load_workload

log = logging.getLogger(__name__)

PREFIX = "/gpushare-scheduler"
# A body must arrive within this long; kube-scheduler sends even a 15,000-node list in well under a second.
BODY_READ_TIMEOUT_S = 10.0
# At most this many node states scored afresh (or nodes copied for a policy that follows the cluster) on the event
# loop per filter or prioritize, a few milliseconds; more (a cold start over thousands of nodes) go to a thread, and
# the filter starts over there. kube-scheduler waits for the answer either way, and the start over and the hop to a
# thread only add to it. On openb's fleet (nine models, 1 to 8 GPUs a node) a 500-name window holds 13 states, and
# 16 sent 3% of the filters to a thread: the p99 of filter was 4.1-4.7 ms with 16 and 3.7-3.9 ms with 32, three runs
# each. With every sharing pod its own GPU share (19 states afresh a filter, 50-70 in the slowest hundredth), 32 sent
# a sixth of the filters to a thread: 0.65 and 0.67 of the floor, p99 5.2 and 5.3 ms, against 0.70 and 0.72, p99 4.7
# and 4.6 ms with 128 (alternating runs).
INLINE_SCORE_READS = 128
# Past the budget, the answer goes out after this margin even if a bind's thread is still stuck in a call.
ANSWER_MARGIN_S = 0.5

class _BodyError(Exception):
    def __init__(self, status: int, sentence: str) -> None:
        super().__init__(sentence)
        self.status = status


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, at most ``limit`` bytes and within ``BODY_READ_TIMEOUT_S``; ``_BodyError`` otherwise.

    A declared Content-Length above the limit is refused before a byte is read; a chunked or lying body is
    counted as it arrives and refused as soon as it passes the limit, so memory never holds more than that.
    """
    too_large = (f"The request body is larger than {limit} bytes, the extender's --max-body-bytes; kube-scheduler "
                 "sends far less with nodeCacheCapable: true, or raise the limit.")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _BodyError(413, too_large)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(BODY_READ_TIMEOUT_S):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise _BodyError(413, too_large)
                chunks.append(chunk)
    except TimeoutError:
        raise _BodyError(408, f"The request body did not arrive within {BODY_READ_TIMEOUT_S:g} s; send it at "
                              "once.") from None
    return b"".join(chunks)


def _json(data: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(data), status_code=status, media_type="application/json")


async def _freeze_when_synced(watch: ClusterWatch, verbs: Verbs, frozen: asyncio.Event) -> None:
    """Show the default policy the cluster listed, exempt the first list's objects from the cyclic garbage
    collector and leave its collections to the moments after answers (``collector``), then set ``frozen``.

    At thousands of nodes the cache holds hundreds of thousands of long-lived objects; every full
    collection would walk them all, a pause of many milliseconds in the middle of some filter request.
    The extender is ready only after this collection, so that no request waits on it; nor does the first
    GPU pod wait for its policy to read every node (``Verbs.show_cluster``: 74-160 ms end to end at 5,000 nodes).
    """
    while not watch.synced:
        await asyncio.sleep(0.1)
    try:
        await run_in_threadpool(verbs.show_cluster)  # off the event loop, which keeps answering /healthz
    except Exception:  # never a reason not to become ready: the first GPU pod's filter shows it the cluster instead
        log.exception("showing the default policy the cluster failed; the first GPU pod's filter will do it")
    collector.freeze()
    frozen.set()


async def _sweep(cache: ClusterCache, gangs: Gangs, metrics: ExtenderMetrics) -> None:
    """Once a second: give back what filter held for pods whose bind never came (memory only), and release gang plans
    past their timeout (Events are API calls: off the event loop)."""
    while True:
        await asyncio.sleep(SWEEP_INTERVAL_S)
        try:
            lapsed = cache.release_lapsed_holds(time.monotonic())
            if lapsed:
                metrics.lapsed_holds.inc(lapsed)
                log.info("gave back the GPUs filter held for pods that no bind came for", extra={
                    "pods": lapsed, "held_s": FILTER_HOLD_S})
            await run_in_threadpool(gangs.expire)
        except Exception:  # the sweeper must outlive any one failure; the next round tries again
            log.exception("giving back lapsed holds or timed-out gang plans failed")


async def _after_answer(hold: Callable[[], None] | None = None) -> None:
    """On the event loop once an answer of kube-scheduler's serial cycle is written: filter's hold (``Filtered.hold``),
    then the garbage collection due (``collector.collect_due``). With no await in between, no other request is read
    first, and kube-scheduler sends the pod's bind, and the next pod's filter, only once it has the answer. A hold not
    made leaves the bind to reserve afresh, as without one."""
    if hold is not None:
        try:
            hold()
        except Exception:
            log.exception("holding the GPUs filter chose for a pod failed; its bind will reserve them afresh")
    collector.collect_due()


def _passed(result: dict[str, Any]) -> list[str]:
    """The node names a filter answer passed, in either of kube-scheduler's modes; none when it failed."""
    if result["NodeNames"] is not None:
        return cast(list[str], result["NodeNames"])
    return [item["metadata"]["name"] for item in (result["Nodes"] or {}).get("items", [])]


HEALTH_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


class HealthOnly:
    """The app as the plain-HTTP health listener serves it: health, readiness and metrics, nothing else.

    Probes and Prometheus hold no client certificate, so with mutual TLS they cannot use the main listener;
    this one answers 404 to every other path, so it opens no way around the certificate.
    """

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in HEALTH_PATHS:
            response = Response("this port serves only /healthz, /readyz and /metrics\n", status_code=404,
                                media_type="text/plain")
            await response(scope, receive, send)
            return
        await self._app(scope, receive, send)


Verb = Callable[[Request], Awaitable[Response]]


class VerbRoutes:
    """kube-scheduler's verbs (POST only), answered in front of the FastAPI app; every other request goes on to it.

    Each GPU pod costs three calls in a row, and the layers FastAPI wraps around a route (its middleware stack,
    matching, dependency solving, the exit stack) cost as much as a filter answered from the cache. The verbs
    read the request and build their answer themselves, so they need none of them. An unexpected exception is
    logged and answered with HTTP 500, as FastAPI's outermost handler does for its own routes.
    """

    def __init__(self, app: FastAPI, verbs: Mapping[str, Verb]) -> None:
        self.app = app
        self._verbs = dict(verbs)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        verb = self._verbs.get(scope["path"]) if scope["type"] == "http" else None
        if verb is None:
            await self.app(scope, receive, send)
            return
        if scope["method"] != "POST":
            response = Response(orjson.dumps({"detail": "Method Not Allowed"}), status_code=405,
                                headers={"Allow": "POST"}, media_type="application/json")
        else:
            try:
                response = await verb(Request(scope, receive))
            except Exception:
                log.exception("the extender failed to answer a request", extra={"path": scope["path"]})
                response = _json({"Error": f"The gpushare extender failed to answer {scope['path']}; its log has "
                                           "the traceback. kube-scheduler will try the pod again."}, 500)
        await response(scope, receive, send)


def _bound(answer: bytes) -> bool:
    """Whether a leader's bind answer says the pod was bound (an ExtenderBindingResult with no Error)."""
    try:
        result = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return False
    return isinstance(result, dict) and result.get("Error") == ""


def create_app(config: ExtenderConfig, kube: Kube, tls: ServerTLS | None = None) -> VerbRoutes:
    """Build the extender around one API server's ``Kube``; the watch starts with the app. ``tls``: the listener's
    TLS, whose refused handshakes and certificates' expiration /metrics shows."""
    cache = ClusterCache(config.unit, config.tie_seed)
    watch = ClusterWatch(kube.nodes.list_call, kube.pods.list_call, cache, list_budgets=kube.budgets.list_call)
    book = PolicyBook(config.policy, load_workload(config.workload_seed) if config.workload_seed else None)
    requests = RequestCache()
    metrics_registry = CollectorRegistry()

    def gang_event(pod: PodInfo, reason: str, message: str) -> None:
        kube.pods.record_event(pod.namespace, pod.name, pod.uid, reason=reason, message=message,
                               component=GANG_COMPONENT)

    gangs = Gangs(cache, watch.gangs, requests, book, kube.pod_groups, gang_event, metrics_registry,
                  config.gang_timeout_s)
    verbs = Verbs(cache, book, requests, gangs, config.node_choice is NodeChoice.FILTER)
    preempt = Preempt(cache, requests, watch.budgets)
    binder = Binder(kube.pods, cache, book, watch.pending, verbs.catch_up, config.bind_timeout_s)
    ledger = FilterLedger()
    # Binds wait on the API server; they get threads of their own, so that however slow it is, filter and
    # prioritize (Starlette's pool) keep their threads. A full pool answers at once instead of queueing.
    bind_pool = ThreadPoolExecutor(max_workers=config.max_binds, thread_name_prefix="bind")
    bind_slots = threading.BoundedSemaphore(config.max_binds)
    # A scrape walks every node; one thread of its own keeps it off the request pools and the event loop.
    metrics_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="metrics")
    elector: LeaderElector | None = None
    forwarder: BindForwarder | None = None
    if config.leader is not None:
        # A replica contends only once its cache holds the whole cluster, so a new leader never binds from an
        # empty cache; the previous leader's placements are in pod annotations, written with each Binding.
        elector = LeaderElector(kube.leases, config.leader, lambda: watch.synced)
        # The leader answers within its budget; the follower waits a little longer.
        # A follower presents the replicas' own certificate: the leader asks every caller for one its client CA
        # signed, and the chart's Secret has the same CA sign both (docs/install.md, "Certificates").
        peer_tls = ClientTLS(config.peer_ca, config.tls_cert, config.tls_key)
        forwarder = BindForwarder(config.leader.identity, peer_tls,
                                  config.bind_timeout_s + ANSWER_MARGIN_S)
    metrics = ExtenderMetrics(cache, lambda: elector is None or elector.is_leader, metrics_registry, tls)

    frozen = asyncio.Event()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        watch.start()
        freezer = asyncio.create_task(_freeze_when_synced(watch, verbs, frozen))
        sweeper = asyncio.create_task(_sweep(cache, gangs, metrics))
        if elector is not None and forwarder is not None:
            await forwarder.open()
            elector.start()
        try:
            yield
        finally:
            freezer.cancel()
            sweeper.cancel()
            if elector is not None and forwarder is not None:
                # Requests have finished by now: hand the lease back so that a peer binds at once.
                await run_in_threadpool(elector.stop)
                await forwarder.close()
            await run_in_threadpool(watch.stop)
            bind_pool.shutdown(wait=False, cancel_futures=True)
            metrics_pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="gpushare scheduler extender", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None)

    def bad_request(verb: str, exc: BadRequest | _BodyError) -> Response:
        status = exc.status if isinstance(exc, _BodyError) else 400
        metrics.count(verb, status)
        return _json({"Error": str(exc)}, status)

    async def filter_verb(request: Request) -> Response:
        with metrics.timed("filter"):
            try:
                args = parse_extender_args(await _read_body(request, config.max_body_bytes))
                # A gang member's filter may read its PodGroup from the API server and plan the whole gang, and
                # choosing a node may score thousands of nodes afresh: off the event loop, which must keep
                # answering health checks and other pods meanwhile. Mostly remembered answers (as for prioritize).
                filtered = None if names_a_gang(args.pod) else verbs.filter(args, INLINE_SCORE_READS)
                if filtered is None:
                    filtered = await run_in_threadpool(verbs.filter, args)
            except (BadRequest, _BodyError) as exc:
                return bad_request("filter", exc)
            ledger.record(args.pod.uid or args.pod.key, _passed(filtered.answer))
            metrics.filtered(args.pod.uid)
            response = _json(filtered.answer)
            response.background = BackgroundTask(_after_answer, filtered.hold)
            metrics.count("filter", 200)
            return response

    async def prioritize_verb(request: Request) -> Response:
        with metrics.timed("prioritize"):
            try:
                args = parse_extender_args(await _read_body(request, config.max_body_bytes))
                # Mostly remembered answers, so on the event loop: a hand-off to a thread costs more than the
                # lookups. Scoring thousands of nodes afresh (a new shape, a policy that learned) takes tens of
                # milliseconds: off the loop, so that filters and binds in flight are not held up behind it.
                scores = verbs.prioritize(args, INLINE_SCORE_READS)
                if scores is None:
                    scores = await run_in_threadpool(verbs.prioritize, args)
                response = Response(host_priority_list(scores), media_type="application/json",
                                    background=BackgroundTask(_after_answer))
            except (BadRequest, _BodyError) as exc:
                return bad_request("prioritize", exc)
            metrics.count("prioritize", 200)
            return response

    async def preempt_verb(request: Request) -> Response:
        with metrics.timed("preempt"):
            try:
                args = parse_preemption_args(await _read_body(request, config.max_body_bytes))
                # A victim search may try thousands of sets on a crowded node: off the event loop.
                response = _json(await run_in_threadpool(preempt, args))
            except (BadRequest, _BodyError) as exc:
                return bad_request("preempt", exc)
            metrics.count("preempt", 200)
            return response

    async def bind_here(args: BindingArgs) -> BindOutcome:
        who = f"pod {args.pod_namespace}/{args.pod_name} to node {args.node}"
        if not bind_slots.acquire(blocking=False):
            return BindOutcome(error=f"gpushare could not bind {who}: {config.max_binds} binds are already in "
                                     "flight (--max-concurrent-binds), as when the API server is slow; kube-scheduler "
                                     "will try again.")
        # The reservation is made here, so that a filter read after this bind sees it; the API calls wait in a thread.
        future = bind_pool.submit(binder.bind, args, binder.hold(args))
        # The slot is free when the thread is, not when the answer leaves: a stuck call keeps its slot.
        future.add_done_callback(lambda _: bind_slots.release())
        wait_s = config.bind_timeout_s + ANSWER_MARGIN_S
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), wait_s)
        except TimeoutError:
            return BindOutcome(error=f"gpushare could not bind {who} within {wait_s:g} s: a call to the API server "
                                     "did not come back in time; kube-scheduler will try again.")

    async def bind_verb(request: Request) -> Response:
        with metrics.timed("bind"):
            try:
                body = await _read_body(request, config.max_body_bytes)
                args = parse_binding_args(body)
            except (BadRequest, _BodyError) as exc:
                return bad_request("bind", exc)
            forwarded_by = request.headers.get(FORWARDED_BY_HEADER)
            pod_key = f"{args.pod_namespace}/{args.pod_name}"
            ledger_key = args.pod_uid or pod_key
            # A forwarded bind was checked by the follower that kube-scheduler filtered through (the Service
            # keeps a scheduler on one replica); the leader never saw that filter.
            problem = None if forwarded_by is not None else ledger.problem(ledger_key, args.node)
            if problem is not None:
                metrics.binds.labels("failed").inc()
                metrics.count("bind", 200)
                return _json({"Error": f"gpushare refused to bind pod {pod_key} to node "
                                       f"{args.node}: {problem}; kube-scheduler will filter it again."})
            if elector is not None and forwarder is not None and not elector.is_leader:
                answer = await forwarder.forward(body, args, elector.view(), forwarded_by)
                if answer.status == 200 and _bound(answer.body):
                    ledger.forget(ledger_key)
                    book.forget(ledger_key)
                else:  # kube-scheduler forgets the pod and filters it again: what this replica's filter held is void
                    cache.drop_filter_hold(pod_key)
                metrics.count("bind", answer.status)
                return Response(answer.body, status_code=answer.status, media_type="application/json")
            outcome = await bind_here(args)
            if not outcome.error:
                ledger.forget(ledger_key)
                book.forget(ledger_key)
                metrics.bound(args.pod_uid)
            else:  # refused before the binder took the hold over (too many in flight), say, or timed out
                cache.drop_filter_hold(pod_key)
            metrics.binds.labels("failed" if outcome.error else "bound").inc()
            metrics.bind_conflicts.inc(outcome.conflicts)
            metrics.count("bind", 200)
            return _json({"Error": outcome.error})


    @app.get(PREFIX + "/inspect")
    def inspect_all() -> Response:
        return _json({"nodes": inspect_nodes(cache), "error": ""})

    @app.get(PREFIX + "/inspect/{node}")
    def inspect_node(node: str) -> Response:
        problem = subdomain_problem(node)
        if problem is not None:
            return _json({"nodes": [], "error": f"The node name {clip(node)} {problem}."}, 400)
        nodes = inspect_nodes(cache, node)
        if not nodes:
            return _json({"nodes": [], "error": f"Node {clip(node)} is not in the gpushare extender's cache; check "
                                                "the name with 'kubectl get nodes'."}, 404)
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

    # Health and readiness run on the event loop and read only memory: they answer in microseconds whatever the
    # API server and the thread pools are doing, so a slow API server never gets the extender restarted.
    @app.get("/healthz")
    async def healthz() -> Response:
        return Response("ok\n", media_type="text/plain")

    @app.get("/readyz")
    async def readyz() -> Response:
        # Ready from the first complete list on, and through API outages: filter and prioritize still answer
        # from the cache, and binds fail fast within their budget. Taking the only endpoints out of the Service
        # would fail every pod's filter instead (see docs/extender.md).
        if frozen.is_set():
            return Response("ok\n", media_type="text/plain")
        return Response("the node and pod caches have not finished their first list yet\n", status_code=503,
                        media_type="text/plain")

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        body = await asyncio.get_running_loop().run_in_executor(metrics_pool, generate_latest, metrics.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return VerbRoutes(app, {PREFIX + "/filter": filter_verb, PREFIX + "/prioritize": prioritize_verb,
                            PREFIX + "/preempt": preempt_verb, PREFIX + "/bind": bind_verb})
