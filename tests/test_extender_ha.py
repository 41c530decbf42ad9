"""Several extender replicas behind one Service: one leader binds, followers forward, takeover when it goes.

Each replica is a real extender app served over HTTP on its own port, electing through a Lease in the local
API server with short lease timings (2 s lease, 0.2 s renew period).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from kubernetes import client
from test_extender_harness import (
    T4,
    T4_MIB,
    create_pod,
    gpu_node,
    metric,
    pod_body,
    read_pod,
    running_extender,
    spec,
    wait_for,
)

from extender.app import create_app
from extender.config import ConfigError, ExtenderConfig, parse_config
from extender.forward import FORWARDED_BY_HEADER
from extender.leader import LEADER_URL_ANNOTATION, LeaseSettings
from gpushare.contract import ANN_IDX, ANN_POD
from gpushare.kube.api import Kube
from gpushare.localcluster import LocalCluster

LEASE_S = 2
RENEW_S = 0.2
NAMESPACE = "kube-system"
LEASE = "gpushare-extender"


def _listening_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextmanager
def replica(cluster: LocalCluster, identity: str) -> Iterator[str]:
    """An extender with --leader-elect on 127.0.0.1:<ephemeral>, advertising that address; yields it once ready.

    Leaving the block stops it the way SIGTERM does: requests finish, then the lease is handed back.
    """
    sock = _listening_socket()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    config = ExtenderConfig(leader=LeaseSettings(namespace=NAMESPACE, name=LEASE, identity=identity,
                                                 advertise_url=url, duration_s=LEASE_S, renew_period_s=RENEW_S))
    app = create_app(config, Kube.from_api_client(cluster.api_client()))
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started or not thread.is_alive(), f"replica {identity} to start")
        assert thread.is_alive(), f"replica {identity} did not start"
        wait_for(lambda: httpx.get(url + "/readyz").status_code == 200, f"replica {identity} to be ready")
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


def leader_state(url: str) -> dict[str, Any]:
    state: dict[str, Any] = httpx.get(url + "/leader").json()
    return state


def settled_leader(urls: list[str], timeout_s: float = LEASE_S * 3) -> str:
    """The URL of the one replica that leads, once every replica agrees on it."""
    def agreed() -> bool:
        states = [leader_state(u) for u in urls]
        leaders = [u for u, s in zip(urls, states, strict=True) if s["leader"]]
        return len(leaders) == 1 and all(s["leaderURL"] == leaders[0] for s in states)

    wait_for(agreed, "exactly one leader that every replica knows", timeout_s)
    [leader] = [u for u in urls if leader_state(u)["leader"]]
    return leader


def used_units(url: str) -> int:
    used: int = httpx.get(url + "/gpushare-scheduler/inspect/gpu-0").json()["nodes"][0]["usedGPU"]
    return used


def bind(url: str, pod: dict[str, Any], node: str, headers: dict[str, str] | None = None) -> str:
    """Filter through ``url`` and bind through it, as kube-scheduler does on one replica; the bind's Error."""
    httpx.post(url + "/gpushare-scheduler/filter", timeout=30,
               content=orjson.dumps({"Pod": pod, "NodeNames": [node]}))
    response = httpx.post(url + "/gpushare-scheduler/bind", timeout=30, headers=headers, content=orjson.dumps(
        {"PodName": pod["metadata"]["name"], "PodNamespace": "default", "PodUID": pod["metadata"]["uid"],
         "Node": node}))
    assert response.status_code == 200, response.text
    return str(response.json()["Error"])


def leases(cluster: LocalCluster) -> Any:
    """The Lease API, untyped: the tests send and read raw JSON dicts."""
    return client.CoordinationV1Api(cluster.api_client())


def read_lease(cluster: LocalCluster) -> dict[str, Any]:
    response = leases(cluster).read_namespaced_lease(LEASE, NAMESPACE, _preload_content=False)
    lease: dict[str, Any] = orjson.loads(response.data)
    return lease


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(spec(gpu_node("gpu-0", (T4, T4_MIB), (T4, T4_MIB)))) as local:
        yield local


def test_exactly_one_replica_leads_and_says_so(cluster: LocalCluster) -> None:
    with replica(cluster, "extender-a") as a, replica(cluster, "extender-b") as b:
        leader = settled_leader([a, b])
        follower = b if leader == a else a
        lease = read_lease(cluster)
        assert lease["spec"]["holderIdentity"] == leader_state(leader)["identity"]
        assert lease["spec"]["leaseDurationSeconds"] == LEASE_S
        assert lease["metadata"]["annotations"][LEADER_URL_ANNOTATION] == leader
        assert leader_state(follower)["holder"] == lease["spec"]["holderIdentity"]
        assert (metric(leader, "gpushare_extender_leader"), metric(follower, "gpushare_extender_leader")) == (1, 0)
        assert httpx.get(follower + "/readyz").status_code == 200  # followers still serve filter


def test_a_bind_sent_to_the_follower_is_done_once_by_the_leader(cluster: LocalCluster) -> None:
    core = client.CoreV1Api(cluster.api_client())
    with replica(cluster, "extender-a") as a, replica(cluster, "extender-b") as b:
        leader = settled_leader([a, b])
        follower = b if leader == a else a
        pod = create_pod(core, pod_body("trainer", 6))
        assert bind(follower, pod, "gpu-0") == ""
        stored = read_pod(core, "trainer")
        assert stored["spec"]["nodeName"] == "gpu-0"
        assert stored["metadata"]["annotations"][ANN_POD] == "6"
        assert metric(leader, 'gpushare_extender_binds_total{result="bound"}') == 1
        assert metric(follower, 'gpushare_extender_binds_total{result="bound"}') == 0
        for url in (leader, follower):  # each replica's cache counts the pod once
            wait_for(lambda: used_units(url) == 6, "the pod in both caches")  # noqa: B023 - called at once
        assert metric(leader, "gpushare_extender_reservations") == 0


def test_concurrent_binds_over_both_replicas_never_overcommit(cluster: LocalCluster) -> None:
    core = client.CoreV1Api(cluster.api_client())
    with replica(cluster, "extender-a") as a, replica(cluster, "extender-b") as b:
        settled_leader([a, b])
        # Two 15 GiB GPUs hold six 4 GiB pods; twelve binds race, half of them through each replica.
        pods = [create_pod(core, pod_body(f"p{i}", 4)) for i in range(12)]
        with ThreadPoolExecutor(12) as pool:
            errors = list(pool.map(lambda item: bind(item[0], item[1], "gpu-0"),
                                   [(a if i % 2 else b, p) for i, p in enumerate(pods)]))
        assert errors.count("") == 6, errors
        # A pod that loses the race fails at its bind (another bind took the room) or at its filter already (other
        # pods' filters hold the room for their binds), and its bind is then refused for naming a node filter did
        # not pass.
        assert all("no longer fits" in e or "did not pass node gpu-0" in e for e in errors if e), errors
        used = {0: 0, 1: 0}
        for pod in pods:
            stored = read_pod(core, pod["metadata"]["name"])
            if stored["spec"].get("nodeName"):
                used[int(stored["metadata"]["annotations"][ANN_IDX])] += 4
        assert used == {0: 12, 1: 12}


def test_the_follower_takes_over_when_the_leader_stops(cluster: LocalCluster) -> None:
    core = client.CoreV1Api(cluster.api_client())
    with ExitStack() as first:
        a = first.enter_context(replica(cluster, "extender-a"))
        wait_for(lambda: leader_state(a)["leader"], "the only replica to lead", LEASE_S * 3)
        with replica(cluster, "extender-b") as b:
            assert settled_leader([a, b]) == a
            transitions = read_lease(cluster)["spec"]["leaseTransitions"]
            first.close()  # the leader shuts down and hands the lease back
            wait_for(lambda: leader_state(b)["leader"], "the follower to take the lease", LEASE_S * 2)
            lease = read_lease(cluster)
            assert lease["spec"]["holderIdentity"] == "extender-b"
            assert lease["spec"]["leaseTransitions"] == transitions + 1
            assert lease["metadata"]["annotations"][LEADER_URL_ANNOTATION] == b
            pod = create_pod(core, pod_body("after", 3))
            assert bind(b, pod, "gpu-0") == ""
            assert read_pod(core, "after")["spec"]["nodeName"] == "gpu-0"


LONG_LEASE_S = 3600


def ghost_lease(cluster: LocalCluster, annotations: dict[str, str]) -> None:
    """A Lease held by a replica that nobody can reach, with a lease long enough not to expire in the test."""
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    leases(cluster).create_namespaced_lease(NAMESPACE, {
        "metadata": {"name": LEASE, "namespace": NAMESPACE, "annotations": annotations},
        "spec": {"holderIdentity": "ghost", "leaseDurationSeconds": LONG_LEASE_S, "acquireTime": now,
                 "renewTime": now, "leaseTransitions": 4}}, _preload_content=False)


def test_a_dead_leaders_lease_is_taken_once_it_expires(cluster: LocalCluster) -> None:
    core = client.CoreV1Api(cluster.api_client())
    dead = _listening_socket()  # bound, never listening: connections are refused
    dead_url = f"http://127.0.0.1:{dead.getsockname()[1]}"
    ghost_lease(cluster, {LEADER_URL_ANNOTATION: dead_url})
    pod = create_pod(core, pod_body("waiting", 2))
    try:
        with replica(cluster, "extender-a") as a:
            wait_for(lambda: leader_state(a)["holder"] == "ghost", "the replica to read the lease")
            error = bind(a, pod, "gpu-0")
            assert f"the leader replica ghost at {dead_url} did not answer" in error, error
            assert error.endswith("kube-scheduler will try again.")
            assert not read_pod(core, "waiting")["spec"].get("nodeName")
            # The ghost's last renewal shortens its lease; then it dies without handing it back.
            lease = read_lease(cluster)
            lease["spec"]["leaseDurationSeconds"] = LEASE_S
            leases(cluster).replace_namespaced_lease(LEASE, NAMESPACE, lease, _preload_content=False)
            wait_for(lambda: leader_state(a)["leader"], "the replica to take the expired lease", LEASE_S * 3)
            lease = read_lease(cluster)
            assert (lease["spec"]["holderIdentity"], lease["spec"]["leaseTransitions"]) == ("extender-a", 5)
            assert bind(a, pod, "gpu-0") == ""
            assert read_pod(core, "waiting")["spec"]["nodeName"] == "gpu-0"
        assert not read_lease(cluster)["spec"].get("holderIdentity"), "a stopped leader hands the lease back"
    finally:
        dead.close()


def test_a_leader_without_an_address_is_reported(cluster: LocalCluster) -> None:
    core = client.CoreV1Api(cluster.api_client())
    ghost_lease(cluster, {})
    pod = create_pod(core, pod_body("waiting", 2))
    with replica(cluster, "extender-a") as a:
        wait_for(lambda: leader_state(a)["holder"] == "ghost", "the replica to read the lease")
        assert leader_state(a)["leader"] is False
        assert metric(a, "gpushare_extender_leader") == 0
        error = bind(a, pod, "gpu-0")
        assert "the leader replica ghost publishes no address (lease annotation gpushare.io/leader-url)" in error
        assert not read_pod(core, "waiting")["spec"].get("nodeName")


def test_a_forwarded_bind_is_never_forwarded_again(cluster: LocalCluster) -> None:
    core = client.CoreV1Api(cluster.api_client())
    with replica(cluster, "extender-a") as a, replica(cluster, "extender-b") as b:
        leader = settled_leader([a, b])
        follower = b if leader == a else a
        pod = create_pod(core, pod_body("looping", 2))
        error = bind(follower, pod, "gpu-0", headers={FORWARDED_BY_HEADER: "extender-c"})
        assert "replica extender-c forwarded the bind to this replica" in error, error
        assert "does not hold the leader lease" in error
        assert not read_pod(core, "looping")["spec"].get("nodeName")
        bad = httpx.post(follower + "/gpushare-scheduler/bind", content=b'{"PodName": 3}')
        assert bad.status_code == 400 and "PodName" in bad.json()["Error"]


def test_a_single_replica_without_election_binds_itself(cluster: LocalCluster) -> None:
    with running_extender(cluster) as url:
        assert leader_state(url) == {"leaderElection": False, "leader": True, "identity": "", "holder": "",
                                     "leaderURL": ""}
        assert metric(url, "gpushare_extender_leader") == 1


def test_leader_election_flags_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_config(["--port", "8080"]).leader is None
    monkeypatch.setenv("POD_NAME", "gpushare-extender-7d9f-x2")
    monkeypatch.setenv("POD_NAMESPACE", "gpushare")
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    leader = parse_config(["--leader-elect", "--port", "8080"]).leader
    assert leader == LeaseSettings(namespace="gpushare", name="gpushare-extender", identity="gpushare-extender-7d9f-x2",
                                   advertise_url="http://10.1.2.3:8080", duration_s=15, renew_period_s=5.0)
    monkeypatch.setenv("POD_IP", "fd00::7")
    custom = parse_config(["--leader-elect", "--lease-name", "gpu", "--lease-namespace", "ops", "--lease-identity",
                           "me", "--lease-duration", "4", "--lease-renew-period", "2"]).leader
    assert custom == LeaseSettings(namespace="ops", name="gpu", identity="me", advertise_url="http://[fd00::7]:39999",
                                   duration_s=4, renew_period_s=2.0)
    given = parse_config(["--leader-elect", "--port", "0", "--advertise-url", "https://extender-0.svc:9443"]).leader
    assert given is not None and given.advertise_url == "https://extender-0.svc:9443"


@pytest.mark.parametrize(("argv", "message"), [
    (["--leader-elect", "--lease-renew-period", "10"], "must be above 0 and at most half of --lease-duration (15)"),
    (["--leader-elect", "--lease-renew-period", "0"], "must be above 0"),
    (["--leader-elect", "--lease-duration", "0"], "--lease-duration 0 must be at least 1 second"),
    (["--leader-elect", "--port", "0"], "leaves the other replicas no port to reach this one"),
    (["--leader-elect", "--advertise-url", "10.0.0.1:39999"], "must be an http:// or https:// URL"),
    (["--leader-elect", "--lease-name", ""], "--lease-name must not be empty"),
    (["--peer-ca", "/nonexistent/ca.crt"], "/nonexistent/ca.crt does not exist"),
])
def test_bad_leader_election_settings_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_config(argv)
