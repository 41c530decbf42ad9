"""A follower's bind: passed on to the leader, whose answer goes back to kube-scheduler unchanged.

Every failure to reach the leader is answered 200 with an ``Error`` sentence, as the binder answers its own
failures: kube-scheduler shows the sentence in the pod's events and schedules the pod again.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import orjson

from extender.leader import LeaderView
from extender.tls import ClientTLS
from extender.wire import BindingArgs

BIND_PATH = "/gpushare-scheduler/bind"
# Names the replica that forwarded a bind; a replica that gets a forwarded bind never forwards it again.
FORWARDED_BY_HEADER = "X-Gpushare-Forwarded-By"
# Under kube-scheduler's own extender timeout (5 s by default), so the follower still gets to answer; the app
# passes the leader's bind budget plus its grace instead, which is this with the default budget.
FORWARD_TIMEOUT_S = 4.0


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes


class BindForwarder:
    """Forwards bind bodies to the leader over one pooled ``httpx.AsyncClient``, opened with the app."""

    def __init__(self, identity: str, tls: ClientTLS, timeout_s: float = FORWARD_TIMEOUT_S) -> None:
        self._identity = identity
        self._tls = tls
        self._timeout_s = timeout_s
        self._client: httpx.AsyncClient | None = None

    async def open(self) -> None:
        # No proxy from the environment: peers are reached directly, on the pod network.
        self._client = httpx.AsyncClient(timeout=self._timeout_s, verify=self._tls.context, trust_env=False)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def forward(self, body: bytes, args: BindingArgs, leader: LeaderView, forwarded_by: str | None) -> Answer:
        failed = f"gpushare could not bind pod {args.pod_namespace}/{args.pod_name} to node {args.node}: "
        if forwarded_by is not None:
            return _error(failed + f"replica {forwarded_by} forwarded the bind to this replica ({self._identity}) "
                          f"as the leader, but this replica does not hold the leader lease (now: "
                          f"{leader.holder or 'nobody'}); kube-scheduler will try again.")
        if not leader.holder:
            return _error(failed + "no extender replica holds the leader lease yet, and only the leader binds; "
                          "kube-scheduler will try again.")
        if not leader.leader_url:
            return _error(failed + f"the leader replica {leader.holder} publishes no address (lease annotation "
                          "gpushare.io/leader-url); kube-scheduler will try again.")
        if self._client is None:
            raise RuntimeError("BindForwarder.open() was not awaited before forward()")
        self._tls.refresh()
        try:
            response = await self._client.post(
                leader.leader_url.rstrip("/") + BIND_PATH, content=body,
                headers={"Content-Type": "application/json", FORWARDED_BY_HEADER: self._identity})
        except httpx.HTTPError as exc:
            return _error(failed + f"the leader replica {leader.holder} at {leader.leader_url} did not answer "
                          f"({type(exc).__name__}: {str(exc) or 'no detail'}); kube-scheduler will try again.")
        return Answer(response.status_code, response.content)


def _error(message: str) -> Answer:
    return Answer(200, orjson.dumps({"Error": message}))
