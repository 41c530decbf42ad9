"""Mutual TLS as kube-scheduler and the chart use it: real extender processes, real handshakes on loopback.

Certificates are minted with the openssl command in the test's temporary directory: a CA that signs the
extender's serving certificate and kube-scheduler's client certificate (as the chart's Secret does), and a
second CA standing for anyone else in the cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest
from kubernetes import client
from test_extender_harness import T4, T4_MIB, create_pod, free_port, gpu_node, metric, pod_body, spec, wait_for
from test_x509 import openssl_not_after

from extender.tls import (
    CLIENT_CERTIFICATE_WINDOW_S,
    CLIENT_CERTIFICATES_KEPT,
    ClientCertificates,
    Refusal,
    certificate_names,
)
from extender.x509 import not_after
from gpushare.localcluster import LocalCluster
from gpushare.localcluster.pki import Issued, client_context, issue, make_ca
from gpushare.localcluster.scheduler import SchedulerLoop

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command for certificates")

PREFIX = "/gpushare-scheduler"
VERBS = ["filter", "prioritize", "bind", "preempt"]


@dataclass(frozen=True)
class Pki:
    ca: Issued
    server: Issued
    scheduler: Issued
    stranger: Issued  # signed by another CA

    def client(self, identity: Issued | None) -> ssl.SSLContext:
        """What a caller uses: trusts the extender's CA, presents ``identity`` if any."""
        return client_context(self.ca, identity)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = make_ca(tmp_path, "gpushare-ca")
    other = make_ca(tmp_path, "other-ca")
    return Pki(ca, issue(ca, tmp_path, "extender", 1, server=True), issue(ca, tmp_path, "kube-scheduler", 2, False),
               issue(other, tmp_path, "stranger", 3, False))


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    with LocalCluster(spec(gpu_node("n1", (T4, T4_MIB)))) as local:
        yield local


@dataclass
class Extender:
    url: str  # the main listener, HTTPS
    health_url: str  # the plain listener: /healthz, /readyz, /metrics
    logs: list[dict[str, object]]


@contextmanager
def extender(cluster: LocalCluster, folder: Path, *flags: str | Path) -> Iterator[Extender]:
    """``gpushare-extender`` as a process on 127.0.0.1, both listeners up and its caches synced."""
    kubeconfig = cluster.write_kubeconfig(folder / "kubeconfig")
    process = subprocess.Popen([sys.executable, "-m", "extender", "--host", "127.0.0.1", "--kubeconfig",
                                str(kubeconfig), *map(str, flags)], stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    logs: list[dict[str, object]] = []
    urls: list[str] = []
    try:
        for line in process.stderr:
            logs.append(json.loads(line))
            message = str(logs[-1]["msg"])
            if message.startswith("Uvicorn running on "):
                urls.append(message.split()[3])
            if len(urls) == 2:
                break
        else:
            raise AssertionError(f"the extender exited without serving: {logs}")
        stderr = process.stderr

        def drain() -> None:
            for line in stderr:
                logs.append(json.loads(line))

        threading.Thread(target=drain, daemon=True).start()
        [url] = [u for u in urls if u.startswith("https://")]
        [health] = [u for u in urls if u.startswith("http://")]
        wait_for(lambda: httpx.get(health + "/readyz").status_code == 200, "the extender's caches to sync", 20)
        yield Extender(url, health, logs)
    finally:
        process.terminate()
        process.wait(timeout=15)
        kubeconfig.unlink()


def api_writes(cluster: LocalCluster) -> dict[str, float]:
    """The local API server's request counts, less lists and watches (the extender's caches) and /metrics itself."""
    counts = {}
    for line in httpx.get(cluster.url + "/metrics").text.splitlines():
        if line.startswith("localcluster_requests_total{") and not any(
                label in line for label in ('verb="list"', 'verb="watch"', 'resource=""')):
            labels, value = line.rsplit(" ", 1)
            counts[labels] = float(value)
    return counts


def test_only_the_client_ca_may_call_the_scheduler_verbs(cluster: LocalCluster, pki: Pki, tmp_path: Path) -> None:
    core = client.CoreV1Api(cluster.api_client())
    pod = create_pod(core, pod_body("p", 4))
    with extender(cluster, tmp_path, "--port", "0", "--health-port", "0", "--tls-cert", pki.server.cert,
                  "--tls-key", pki.server.key, "--tls-client-ca", pki.ca.cert) as ext:
        before = api_writes(cluster)
        bind_body = orjson.dumps({"PodName": "p", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"],
                                  "Node": "n1"})
        for caller in (None, pki.stranger):
            with httpx.Client(base_url=ext.url, verify=pki.client(caller)) as http:
                for verb in VERBS:
                    with pytest.raises(httpx.TransportError):  # the handshake fails: no request is read
                        http.post(f"{PREFIX}/{verb}", content=bind_body)
                for path in ("/inspect", "/inspect/n1"):
                    with pytest.raises(httpx.TransportError):
                        http.get(PREFIX + path)
        # Probes and Prometheus hold no certificate: the plain listener serves them, and only them.
        for path in ("/healthz", "/readyz", "/metrics"):
            assert httpx.get(ext.health_url + path).status_code == 200
        assert httpx.post(ext.health_url + PREFIX + "/bind", content=bind_body).status_code == 404
        assert httpx.get(ext.health_url + PREFIX + "/inspect").status_code == 404

        with httpx.Client(base_url=ext.url, verify=pki.client(pki.scheduler)) as http:
            # kube-scheduler's own credentials still cannot bind a pod it did not filter through the extender.
            error = http.post(PREFIX + "/bind", content=bind_body).json()["Error"]
            assert error.startswith("gpushare refused to bind pod default/p to node n1: this extender replica did "
                                    "not filter the pod")
            assert http.get(PREFIX + "/inspect/n1").json()["nodes"][0]["name"] == "n1"
        assert api_writes(cluster) == before, "a refused caller reached the API server"
        assert not read_node_name(cluster, "p")

        with SchedulerLoop(cluster.api_client(), ext.url + PREFIX, tls=pki.client(pki.scheduler)) as loop:
            result = loop.schedule_pod("p")
        assert result.node == "n1", result.message
        assert read_node_name(cluster, "p") == "n1"
    assert not any(str(entry["msg"]).startswith("INSECURE") for entry in ext.logs)


def read_node_name(cluster: LocalCluster, name: str) -> str | None:
    spec = client.CoreV1Api(cluster.api_client()).read_namespaced_pod(name, "default").spec
    assert spec is not None
    node: str | None = spec.node_name
    return node


def test_without_a_client_ca_the_extender_warns_at_start(cluster: LocalCluster, pki: Pki, tmp_path: Path) -> None:
    with extender(cluster, tmp_path, "--port", "0", "--health-port", "0", "--tls-cert", pki.server.cert,
                  "--tls-key", pki.server.key) as ext:
        assert httpx.get(ext.url + "/version", verify=pki.client(None)).status_code == 200
    [warning] = [entry for entry in ext.logs if str(entry["msg"]).startswith("INSECURE")]
    assert warning["level"] == "WARNING" and "--tls-client-ca" in str(warning["msg"])


class SecretVolume:
    """A folder laid out as the kubelet lays out a Secret volume, and updated the way it updates one.

    The files are symlinks through ``..data`` to a timestamped folder; an update writes a new folder and
    renames a new ``..data`` link over the old one, so a reader sees the old set or the new set, never a mix.
    """

    NAMES = ("tls.crt", "tls.key", "client-ca.crt")

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()
        self._generation = 0

    def path(self, name: str) -> Path:
        return self.root / name

    def write(self, files: dict[str, bytes]) -> None:
        self._generation += 1
        folder = self.root / f"..2026_{self._generation:04d}"
        folder.mkdir()
        for name, data in files.items():
            (folder / name).write_bytes(data)
        (self.root / "..data_tmp").symlink_to(folder.name)
        os.rename(self.root / "..data_tmp", self.root / "..data")
        for name in files:
            if not (self.root / name).is_symlink():
                (self.root / name).symlink_to(f"..data/{name}")
        for old in self.root.glob("..2026_*"):
            if old != folder:
                shutil.rmtree(old)


def served_certificate(port: int, context: ssl.SSLContext) -> tuple[bytes, int]:
    """One new connection: the certificate the extender presented and the status of GET /version on it."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        certificate = tls.getpeercert(binary_form=True)
        assert certificate is not None
        tls.sendall(b"GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
    return certificate, int(answer.split(b" ", 2)[1])


def test_the_certificates_expiration_is_on_metrics_and_a_renewal_shows_there_before_any_client_connects(
        cluster: LocalCluster, tmp_path: Path) -> None:
    ca = make_ca(tmp_path, "ca-90-days", days=90)
    first = issue(ca, tmp_path, "extender-30-days", 1, server=True, days=30)
    renewed = issue(ca, tmp_path, "extender-60-days", 2, server=True, days=60)
    volume = SecretVolume(tmp_path / "tls")
    volume.write({"tls.crt": first.cert.read_bytes(), "tls.key": first.key.read_bytes(),
                  "client-ca.crt": ca.cert.read_bytes()})
    name = "gpushare_extender_tls_certificate_expiration_timestamp_seconds"
    serving, client_ca = name + '{certificate="serving"}', name + '{certificate="client_ca"}'
    with extender(cluster, tmp_path, "--port", "0", "--health-port", "0", "--tls-cert", volume.path("tls.crt"),
                  "--tls-key", volume.path("tls.key"), "--tls-client-ca", volume.path("client-ca.crt")) as ext:
        assert metric(ext.health_url, serving) == openssl_not_after(first.cert).timestamp()
        assert metric(ext.health_url, client_ca) == openssl_not_after(ca.cert).timestamp()
        volume.write({"tls.crt": renewed.cert.read_bytes(), "tls.key": renewed.key.read_bytes(),
                      "client-ca.crt": ca.cert.read_bytes()})
        # No client connected since: an alert on the old date would fire for a certificate already replaced.
        wait_for(lambda: metric(ext.health_url, serving) == openssl_not_after(renewed.cert).timestamp(),
                 "the renewed certificate's expiration on /metrics", 10)
    [start] = [entry for entry in ext.logs if entry["msg"] == "starting gpushare extender"]
    assert start["tls"] == "mutual"
    assert start["serving_expires"] == openssl_not_after(first.cert).isoformat()
    [reload] = [entry for entry in ext.logs if entry["msg"] == "loaded the renewed TLS certificate"]
    assert reload["serving_expires"] == openssl_not_after(renewed.cert).isoformat()
    assert reload["client_ca_expires"] == openssl_not_after(ca.cert).isoformat()


def test_the_first_client_certificate_to_expire_of_those_admitted_is_on_metrics(cluster: LocalCluster,
                                                                               tmp_path: Path) -> None:
    """kube-scheduler's certificate expiring fails every GPU pod too, and only what it presents says whether a
    renewed one is in use; the replicas' own certificate (the serving one, for forwarded binds) is not a client's."""
    ca = make_ca(tmp_path, "ca", days=90)
    server = issue(ca, tmp_path, "extender", 1, server=True, days=60)
    soon, later = (issue(ca, tmp_path, f"kube-scheduler-{days}-days", 2 + days, False, days=days) for days in (3, 10))
    client = 'gpushare_extender_tls_certificate_expiration_timestamp_seconds{certificate="client"}'
    with extender(cluster, tmp_path, "--port", "0", "--health-port", "0", "--tls-cert", server.cert, "--tls-key",
                  server.key, "--tls-client-ca", ca.cert) as ext:
        port = int(ext.url.rsplit(":", 1)[1])
        served_certificate(port, client_context(ca, server))
        assert metric(ext.health_url, client) == 0.0  # none admitted yet but the replicas' own
        served_certificate(port, client_context(ca, later))
        assert metric(ext.health_url, client) == openssl_not_after(later.cert).timestamp()
        served_certificate(port, client_context(ca, soon))
        served_certificate(port, client_context(ca, later))
        assert metric(ext.health_url, client) == openssl_not_after(soon.cert).timestamp()


def test_client_certificates_drop_out_an_hour_after_they_were_last_admitted_and_the_record_is_bounded(
        tmp_path: Path) -> None:
    ca = make_ca(tmp_path, "ca", days=90)
    soon, later = (ssl.PEM_cert_to_DER_cert(issue(ca, tmp_path, f"c{days}", days, False, days=days).cert.read_text())
                   for days in (3, 10))
    clients = ClientCertificates()
    assert clients.earliest_expiration(0.0) is None
    clients.admitted(soon, 100.0)
    clients.admitted(later, 200.0)
    assert clients.earliest_expiration(200.0) == not_after(soon)
    assert clients.earliest_expiration(100.0 + CLIENT_CERTIFICATE_WINDOW_S + 1) == not_after(later)
    clients.admitted(soon, 5000.0)  # presented again: back in the window
    assert clients.earliest_expiration(5000.0 + CLIENT_CERTIFICATE_WINDOW_S) == not_after(soon)
    # A client with a new certificate on every connection (a byte past a certificate's end makes another DER with
    # the same dates): the record keeps the latest seen, and the one seen longest ago goes.
    clients = ClientCertificates()
    clients.admitted(soon, 6000.0)
    for serial in range(CLIENT_CERTIFICATES_KEPT):
        clients.admitted(later + bytes([serial]), 6000.0)
    assert clients.earliest_expiration(6000.0) == not_after(later)


def test_no_session_ticket_is_issued_since_kube_scheduler_never_resumes_a_session(cluster: LocalCluster, pki: Pki,
                                                                                   tmp_path: Path) -> None:
    with extender(cluster, tmp_path, "--port", "0", "--health-port", "0", "--tls-cert", pki.server.cert,
                  "--tls-key", pki.server.key, "--tls-client-ca", pki.ca.cert) as ext:
        port = int(ext.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                pki.client(pki.scheduler).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(b"GET /version HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := tls.recv(65536):  # a TLS 1.3 server sends its tickets before the answer
                answer += chunk
            assert tls.version() == "TLSv1.3" and answer.startswith(b"HTTP/1.1 200 ")
            assert tls.session is not None and not tls.session.has_ticket


def test_tls_1_2_offers_only_forward_secret_aead_suites(cluster: LocalCluster, pki: Pki, tmp_path: Path) -> None:
    with extender(cluster, tmp_path, "--port", "0", "--health-port", "0", "--tls-cert", pki.server.cert,
                  "--tls-key", pki.server.key, "--tls-client-ca", pki.ca.cert) as ext:
        port = int(ext.url.rsplit(":", 1)[1])

        def tls12(ciphers: str) -> tuple[str, str, int] | None:
            context = pki.client(pki.scheduler)
            context.maximum_version = ssl.TLSVersion.TLSv1_2
            context.set_ciphers(ciphers)
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
                try:
                    with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                        return tls.cipher()
                except ssl.SSLError:
                    return None

        chosen = tls12("DEFAULT")
        assert chosen is not None and chosen[0] == "ECDHE-ECDSA-AES256-GCM-SHA384"
        assert tls12("ECDHE-ECDSA-CHACHA20-POLY1305") is not None
        for weak in ("ECDHE-ECDSA-AES128-SHA256", "ECDHE-ECDSA-AES256-SHA", "AES128-GCM-SHA256"):
            assert tls12(weak) is None, weak
        wait_for(lambda: refused_counts(ext.health_url)["other"] == 3.0, "the three refusals to be counted", 10)


def refused_counts(health_url: str) -> dict[str, float]:
    counts = {}
    for line in httpx.get(health_url + "/metrics").text.splitlines():
        if line.startswith("gpushare_extender_tls_refused_handshakes_total{"):
            labels, value = line.rsplit(" ", 1)
            counts[labels.split('reason="')[1].split('"')[0]] = float(value)
    return counts


def test_a_refused_handshake_is_counted_by_reason_and_logged_once_a_minute_with_what_to_fix(
        cluster: LocalCluster, pki: Pki, tmp_path: Path) -> None:
    """The event loop drops a failed handshake without a word; the operator must still learn why kube-scheduler
    cannot reach the extender, from the extender's side, without a scanner flooding the log."""
    with extender(cluster, tmp_path, "--port", "0", "--health-port", "0", "--tls-cert", pki.server.cert,
                  "--tls-key", pki.server.key, "--tls-client-ca", pki.ca.cert) as ext:
        port = int(ext.url.rsplit(":", 1)[1])
        assert refused_counts(ext.health_url) == dict.fromkeys(
            ["plain_http", "no_client_certificate", "client_certificate", "client_name", "server_certificate", "other"],
            0.0)

        def attempt(context: ssl.SSLContext | None, first_bytes: bytes = b"GET /version HTTP/1.1\r\nHost: x\r\n\r\n"
                    ) -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
                try:
                    if context is None:
                        raw.sendall(first_bytes)
                        return raw.recv(100)
                    with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                        tls.sendall(first_bytes)
                        return tls.recv(100)
                except OSError:  # TLS 1.3 tells a client of its refused certificate only when it reads
                    return b""

        distrustful = client_context(pki.stranger, pki.scheduler)  # trusts not the CA that signed the server
        assert attempt(None) == b""  # plain HTTP to the HTTPS port
        assert attempt(None, b"\x16\x00\x00garbage\r\n\r\n") == b""
        assert attempt(pki.client(None)) == b""
        for _ in range(3):
            assert attempt(pki.client(pki.stranger)) == b""
        assert attempt(distrustful) == b""
        expected = {"plain_http": 1.0, "no_client_certificate": 1.0, "client_certificate": 3.0, "client_name": 0.0,
                    "server_certificate": 1.0, "other": 1.0}
        wait_for(lambda: refused_counts(ext.health_url) == expected, "the refusals to be counted", 10)
        assert attempt(pki.client(pki.scheduler)).startswith(b"HTTP/1.1 200 ")  # and kube-scheduler still gets in

        lines = {str(entry["reason"]): str(entry["msg"]) for entry in ext.logs
                 if entry.get("logger") == "extender.tls" and "reason" in entry}
        assert sum(entry.get("logger") == "extender.tls" and "reason" in entry for entry in ext.logs) == 5
        assert "enableHTTPS: true" in lines["plain_http"]
        assert "presented no certificate" in lines["no_client_certificate"]
        assert "(unable to get local issuer certificate)" in lines["client_certificate"]
        assert "--tls-client-ca" in lines["client_certificate"]
        assert "(TLSV1_ALERT_UNKNOWN_CA)" in lines["server_certificate"] and "caFile" in lines["server_certificate"]
        assert "(WRONG_VERSION_NUMBER)" in lines["other"]


def test_client_names_admit_only_certificates_naming_one_of_them_and_the_replicas_own(
        cluster: LocalCluster, pki: Pki, tmp_path: Path) -> None:
    """A client CA that signs other workloads' certificates too must not let them call the extender."""
    intruder = issue(pki.ca, tmp_path, "intruder", 20, False)  # the same CA, another name
    with extender(cluster, tmp_path, "--port", "0", "--health-port", "0", "--tls-cert", pki.server.cert,
                  "--tls-key", pki.server.key, "--tls-client-ca", pki.ca.cert,
                  "--tls-client-names", "gpushare-scheduler,kube-scheduler") as ext:
        for identity in (pki.scheduler, pki.server):  # kube-scheduler, and a replica forwarding a bind
            with httpx.Client(base_url=ext.url, verify=pki.client(identity)) as http:
                assert http.get(PREFIX + "/inspect/n1").status_code == 200
        for _ in range(2):
            with httpx.Client(base_url=ext.url, verify=pki.client(intruder)) as http, \
                    pytest.raises(httpx.TransportError):
                http.get(PREFIX + "/inspect/n1")
        wait_for(lambda: refused_counts(ext.health_url)["client_name"] == 2.0, "the refusals to be counted", 10)
        assert refused_counts(ext.health_url)["client_certificate"] == 0.0
        [line] = [str(entry["msg"]) for entry in ext.logs if entry.get("reason") == "client_name"]
        assert "signed but it names intruder, none of gpushare-scheduler, kube-scheduler: " in line
        assert "--tls-client-names" in line and "extender.tls.clientNames" in line


def test_with_client_names_a_follower_still_forwards_binds_to_the_leader_over_mutual_tls(
        cluster: LocalCluster, pki: Pki, tmp_path: Path) -> None:
    """The replicas present their own serving certificate to each other, which names none of the client names."""
    core = client.CoreV1Api(cluster.api_client())
    pod = create_pod(core, pod_body("p", 4))

    def replica(identity: str, port: int) -> AbstractContextManager[Extender]:
        folder = tmp_path / identity
        folder.mkdir()
        return extender(cluster, folder, "--port", str(port), "--health-port", "0", "--tls-cert", pki.server.cert,
                        "--tls-key", pki.server.key, "--tls-client-ca", pki.ca.cert, "--tls-client-names",
                        "kube-scheduler", "--leader-elect", "--lease-identity", identity, "--advertise-url",
                        f"https://127.0.0.1:{port}", "--lease-duration", "2", "--lease-renew-period", "0.2",
                        "--peer-ca", pki.ca.cert)

    with replica("extender-a", free_port()) as a, replica("extender-b", free_port()) as b:
        def leading() -> list[Extender]:
            return [e for e in (a, b) if metric(e.health_url, "gpushare_extender_leader") == 1]

        wait_for(lambda: len(leading()) == 1, "one replica to lead", 20)
        [leader] = leading()
        follower = b if leader is a else a
        with httpx.Client(base_url=follower.url + PREFIX, verify=pki.client(pki.scheduler), timeout=30) as http:
            http.post("/filter", content=orjson.dumps({"Pod": pod, "NodeNames": ["n1"]}))
            answer = http.post("/bind", content=orjson.dumps({"PodName": "p", "PodNamespace": "default",
                                                              "PodUID": pod["metadata"]["uid"], "Node": "n1"}))
        assert answer.json()["Error"] == ""
        assert read_node_name(cluster, "p") == "n1"
        assert metric(leader.health_url, 'gpushare_extender_binds_total{result="bound"}') == 1
        assert metric(follower.health_url, 'gpushare_extender_binds_total{result="bound"}') == 0
        assert refused_counts(leader.health_url)["client_name"] == 0


def test_with_client_names_the_replicas_own_certificate_before_a_renewal_still_gets_in(
        cluster: LocalCluster, pki: Pki, tmp_path: Path) -> None:
    """The kubelets of two replicas swap the Secret's files at different moments: for a while a follower presents
    the certificate before the renewal, or the leader still holds it."""
    volume = SecretVolume(tmp_path / "tls")
    first = pki.server
    second = issue(pki.ca, tmp_path, "extender-second", 11, server=True)
    third = issue(pki.ca, tmp_path, "extender-third", 12, server=True)

    def mount(serving: Issued) -> None:
        volume.write({"tls.crt": serving.cert.read_bytes(), "tls.key": serving.key.read_bytes(),
                      "client-ca.crt": pki.ca.cert.read_bytes()})

    mount(first)
    with extender(cluster, tmp_path, "--port", "0", "--health-port", "0", "--tls-cert", volume.path("tls.crt"),
                  "--tls-key", volume.path("tls.key"), "--tls-client-ca", volume.path("client-ca.crt"),
                  "--tls-client-names", "kube-scheduler") as ext:
        def admitted(identity: Issued) -> bool:
            # Each client opens a connection of its own; its ClientHello makes the extender read changed files.
            with httpx.Client(verify=pki.client(identity)) as http:
                try:
                    return http.get(ext.url + "/version").status_code == 200
                except httpx.TransportError:
                    return False

        assert admitted(first) and not admitted(second)
        mount(second)
        assert admitted(second) and admitted(first)  # the renewed one, and the one before it
        mount(second)  # the same files written again: still the one before the renewal
        assert admitted(first)
        mount(third)
        assert admitted(third) and admitted(second) and not admitted(first)
        assert admitted(pki.scheduler)


def test_certificate_names_are_its_common_names_and_dns_names() -> None:
    certificate = {"subject": ((("organizationName", "system:masters"),), (("commonName", "kube-scheduler"),)),
                   "subjectAltName": (("DNS", "scheduler.example"), ("IP Address", "10.0.0.1"))}
    assert certificate_names(certificate) == ("kube-scheduler", "scheduler.example")
    assert certificate_names({}) == ()


def ssl_error(reason: str) -> ssl.SSLError:
    exc = ssl.SSLError(1, f"[SSL: {reason}]")
    exc.reason = reason
    return exc


@pytest.mark.parametrize(("reason", "refusal"), [
    ("HTTP_REQUEST", Refusal.PLAIN_HTTP),
    ("PEER_DID_NOT_RETURN_A_CERTIFICATE", Refusal.NO_CLIENT_CERTIFICATE),
    ("SSLV3_ALERT_BAD_CERTIFICATE", Refusal.SERVER_CERTIFICATE),  # what Go's crypto/tls sends
    ("SSLV3_ALERT_CERTIFICATE_UNKNOWN", Refusal.SERVER_CERTIFICATE),
    ("TLSV1_ALERT_UNKNOWN_CA", Refusal.SERVER_CERTIFICATE),
    ("UNSUPPORTED_PROTOCOL", Refusal.OTHER),
    ("SSLV3_ALERT_HANDSHAKE_FAILURE", Refusal.OTHER),
])
def test_each_openssl_reason_is_told_apart(reason: str, refusal: Refusal) -> None:
    assert Refusal.of(ssl_error(reason)) is refusal


def test_a_refused_client_certificate_is_told_apart_by_its_class() -> None:
    assert Refusal.of(ssl.SSLCertVerificationError(1, "certificate verify failed")) is Refusal.CLIENT_CERTIFICATE


def test_a_renewed_certificate_is_served_on_the_next_connection(cluster: LocalCluster, pki: Pki,
                                                                tmp_path: Path) -> None:
    volume = SecretVolume(tmp_path / "tls")
    volume.write({"tls.crt": pki.server.cert.read_bytes(), "tls.key": pki.server.key.read_bytes(),
                  "client-ca.crt": pki.ca.cert.read_bytes()})
    renewed = issue(pki.ca, tmp_path, "extender-renewed", 10, server=True)
    first_der = ssl.PEM_cert_to_DER_cert(pki.server.cert.read_text())
    renewed_der = ssl.PEM_cert_to_DER_cert(renewed.cert.read_text())
    context = pki.client(pki.scheduler)
    with extender(cluster, tmp_path, "--port", "0", "--health-port", "0", "--tls-cert", volume.path("tls.crt"),
                  "--tls-key", volume.path("tls.key"), "--tls-client-ca", volume.path("client-ca.crt")) as ext:
        port = int(ext.url.rsplit(":", 1)[1])
        seen: list[tuple[float, bytes, int]] = []
        failures: list[BaseException] = []
        stop = threading.Event()

        def poll() -> None:  # kube-scheduler's calls, each on a new connection, throughout the renewal
            while not stop.is_set():
                started = time.monotonic()
                try:
                    seen.append((started, *served_certificate(port, context)))
                except (OSError, ssl.SSLError) as exc:
                    failures.append(exc)

        poller = threading.Thread(target=poll)
        poller.start()
        try:
            wait_for(lambda: len(seen) >= 5, "connections with the first certificate")
            volume.write({"tls.crt": renewed.cert.read_bytes(), "tls.key": renewed.key.read_bytes(),
                          "client-ca.crt": pki.ca.cert.read_bytes()})
            renewed_at = time.monotonic()
            wait_for(lambda: sum(1 for s in seen if s[0] > renewed_at) >= 5, "connections after the renewal")
        finally:
            stop.set()
            poller.join()
    assert not failures, failures
    assert all(status == 200 for _, _, status in seen)
    assert seen[0][1] == first_der
    # Every connection opened after the files were swapped got the renewed certificate.
    assert {der for started, der, _ in seen if started > renewed_at} == {renewed_der}
    assert any(entry["msg"] == "loaded the renewed TLS certificate" for entry in ext.logs)
