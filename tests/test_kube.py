"""``gpushare.kube``: finding the cluster as kubectl does, and the API layer's calls and error sentences."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import answer_json, cluster_spec
from kubernetes import client
from test_extender_harness import free_port

from gpushare.kube.api import Conflict, Invalid, Kube, NotFound, Unavailable
from gpushare.kube.client import KubeConfigError, connect, load_configuration
from gpushare.localcluster import LocalCluster


@pytest.fixture(scope="module")
def local() -> Iterator[LocalCluster]:
    with LocalCluster(cluster_spec(nodes=1)) as cluster:
        yield cluster


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No kubeconfig anywhere and not in a pod; returns the (empty) home folder."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    return home


def kubeconfig(path: Path, servers: dict[str, str], current: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": current,
        "clusters": [{"name": n, "cluster": {"server": url}} for n, url in servers.items()],
        "users": [{"name": "user", "user": {}}],
        "contexts": [{"name": n, "context": {"cluster": n, "user": "user"}} for n in servers]}))
    return path


def service_account(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "token").write_text("sa-token")
    (folder / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    return folder


def in_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")


def test_precedence_is_flag_then_env_then_home_then_service_account(
        clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sa = service_account(tmp_path / "sa")
    in_a_pod(monkeypatch)
    assert load_configuration(service_account_dir=sa).host == "https://10.96.0.1:443"
    kubeconfig(clean_env / ".kube" / "config", {"home": "http://home:1"}, "home")
    assert load_configuration(service_account_dir=sa).host == "http://home:1"
    env_file = kubeconfig(tmp_path / "env.yaml", {"env": "http://env:2"}, "env")
    monkeypatch.setenv("KUBECONFIG", str(env_file))
    assert load_configuration(service_account_dir=sa).host == "http://env:2"
    flag_file = kubeconfig(tmp_path / "flag.yaml", {"flag": "http://flag:3"}, "flag")
    assert load_configuration(flag_file, service_account_dir=sa).host == "http://flag:3"


def test_kubeconfig_env_merges_its_files_and_skips_missing_ones(
        clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = kubeconfig(tmp_path / "a.yaml", {"a": "http://a:1"}, "a")
    second = kubeconfig(tmp_path / "b.yaml", {"b": "http://b:2"}, "b")
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing.yaml'}:{first}:{second}")
    assert load_configuration().host == "http://a:1"  # the first file's current-context wins
    assert load_configuration(context="b").host == "http://b:2"  # the second file's context is there too


def test_a_set_kubeconfig_env_hides_the_home_file_as_kubectl_does(
        clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kubeconfig(clean_env / ".kube" / "config", {"home": "http://home:1"}, "home")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing.yaml"))
    with pytest.raises(KubeConfigError) as caught:
        load_configuration()
    assert str(caught.value) == (f"Cannot find a Kubernetes cluster: tried $KUBECONFIG ({tmp_path / 'missing.yaml'}, "
                                 "no such file), and this is not a pod ($KUBERNETES_SERVICE_HOST is not set); pass "
                                 "--kubeconfig, or set $KUBECONFIG.")


def test_context_picks_a_cluster_of_the_file(clean_env: Path, tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "config", {"one": "http://one:1", "two": "http://two:2"}, "one")
    assert load_configuration(path).host == "http://one:1"
    assert load_configuration(path, "two").host == "http://two:2"
    with pytest.raises(KubeConfigError, match=r"^Cannot load the Kubernetes configuration from .*three"):
        load_configuration(path, "three")


def test_nothing_found_is_one_sentence_naming_what_was_tried(clean_env: Path) -> None:
    with pytest.raises(KubeConfigError) as caught:
        load_configuration()
    assert str(caught.value) == (f"Cannot find a Kubernetes cluster: tried {clean_env / '.kube' / 'config'} (no such "
                                 "file), and this is not a pod ($KUBERNETES_SERVICE_HOST is not set); pass "
                                 "--kubeconfig, or set $KUBECONFIG.")


def test_a_missing_kubeconfig_flag_file_is_named(clean_env: Path, tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError) as caught:
        load_configuration(tmp_path / "absent")
    assert str(caught.value) == (f"Cannot load the Kubernetes configuration from {tmp_path / 'absent'}: there is no "
                                 "such file; pass --kubeconfig with the path of a kubeconfig file.")


def test_context_without_a_kubeconfig_is_refused_even_in_a_pod(
        clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    in_a_pod(monkeypatch)
    with pytest.raises(KubeConfigError, match=r"^--context prod names a kubeconfig context, but there is no"):
        load_configuration(context="prod", service_account_dir=service_account(tmp_path / "sa"))


def test_service_account_token_and_ca_are_used(clean_env: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    in_a_pod(monkeypatch)
    sa = service_account(tmp_path / "sa")
    configuration = load_configuration(service_account_dir=sa)
    assert configuration.api_key["BearerToken"] == "bearer sa-token"
    assert configuration.ssl_ca_cert == str(sa / "ca.crt")
    assert configuration.retries is False


def test_a_pod_without_its_service_account_token_is_told_what_to_mount(
        clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    in_a_pod(monkeypatch)
    with pytest.raises(KubeConfigError) as caught:
        load_configuration(service_account_dir=tmp_path / "absent")
    assert str(caught.value) == (f"Cannot use the pod's service account in {tmp_path / 'absent'} (Service token file "
                                 "does not exist); mount the service account token, or pass --kubeconfig.")


def test_connect_reaches_the_cluster_without_retries(clean_env: Path, local: LocalCluster, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = local.write_kubeconfig(tmp_path / "config")
    monkeypatch.setenv("KUBECONFIG", str(path))
    kube = connect()
    assert kube.host == local.url
    assert [n["metadata"]["name"] for n in kube.nodes.list()] == ["node-0"]


# -- the API layer against the local API server ------------------------------------------------------------


@pytest.fixture
def kube(local: LocalCluster) -> Kube:
    return Kube.from_api_client(local.api_client())


def pod(name: str) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


def test_annotate_with_a_stale_version_is_a_conflict_and_none_removes(kube: Kube, local: LocalCluster) -> None:
    core = client.CoreV1Api(local.api_client())
    core.create_namespaced_pod("default", pod("annotated"))
    first = kube.pods.read("default", "annotated")
    version = first["metadata"]["resourceVersion"]
    written = kube.pods.annotate("default", "annotated", version, {"a": "1", "b": "2"})
    assert written["metadata"]["annotations"] == {"a": "1", "b": "2"}
    with pytest.raises(Conflict) as caught:
        kube.pods.annotate("default", "annotated", version, {"a": "3"})
    assert caught.value.status == 409
    assert str(caught.value).startswith(f"Could not write the annotations of pod default/annotated: the API server "
                                        f"at {kube.host} answered 409 Conflict (")
    after = kube.pods.annotate("default", "annotated", None, {"a": None})
    assert after["metadata"]["annotations"] == {"b": "2"}


def test_missing_objects_are_not_found_with_the_servers_message(kube: Kube) -> None:
    with pytest.raises(NotFound) as caught:
        kube.pods.read("default", "ghost")
    assert caught.value.api_message == 'pods "ghost" not found'
    assert str(caught.value) == (f"Could not read pod default/ghost: the API server at {kube.host} answered 404 Not "
                                 'Found (pods "ghost" not found).')


def test_bind_twice_is_a_conflict_and_a_bad_patch_is_invalid(kube: Kube, local: LocalCluster) -> None:
    core = client.CoreV1Api(local.api_client())
    created = core.create_namespaced_pod("default", pod("bound"))
    kube.pods.bind("default", "bound", created.metadata.uid, "node-0")
    assert kube.pods.read("default", "bound")["spec"]["nodeName"] == "node-0"
    with pytest.raises(Conflict, match="already assigned"):
        kube.pods.bind("default", "bound", created.metadata.uid, "node-0")
    with pytest.raises(Invalid) as caught:
        kube.leases.create("default", {"metadata": {"name": "Bad_Name!"}, "spec": {}})
    assert str(caught.value).startswith(f"The API server at {kube.host} rejected the request to create lease "
                                        'default/Bad_Name! (422 Unprocessable Entity): Lease.coordination.k8s.io '
                                        '"Bad_Name!" is invalid: ')
    assert not str(caught.value).endswith("..")


def test_an_unreachable_server_is_unavailable_at_once(clean_env: Path, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    kube = connect(kubeconfig(tmp_path / "config", {"gone": url}, "gone"))
    with pytest.raises(Unavailable) as caught:
        kube.pods.read("default", "p")
    assert str(caught.value).startswith(f"Cannot reach the Kubernetes API server at {url} to read pod default/p (")
    assert str(caught.value).endswith("; check the kubeconfig context and that the cluster is running.")


@pytest.fixture
def silent_url() -> Iterator[str]:
    """The URL of a server that accepts connections (the backlog) and never answers."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        yield f"http://127.0.0.1:{silent.getsockname()[1]}"


def test_a_silent_server_is_unavailable_after_the_callers_timeout(clean_env: Path, tmp_path: Path,
                                                                  silent_url: str) -> None:
    kube = connect(kubeconfig(tmp_path / "config", {"silent": silent_url}, "silent"))
    with pytest.raises(Unavailable) as caught:
        kube.nodes.read("node-0", timeout_s=0.2)
    assert str(caught.value) == (f"The API server at {silent_url} did not answer within 0.2 s when asked to read node "
                                 "node-0; check that the cluster is running and not overloaded.")


def test_a_bind_writes_node_and_annotations_once_and_fails_as_every_call_does(
        kube: Kube, local: LocalCluster, clean_env: Path, tmp_path: Path, silent_url: str) -> None:
    """The Binding's preconditions (uid, resourceVersion) hold, its annotations land with the node, and its
    failures read as every other call's."""
    client.CoreV1Api(local.api_client()).create_namespaced_pod("default", pod("to-bind"))
    created = kube.pods.read("default", "to-bind")["metadata"]
    with pytest.raises(Conflict, match="Precondition failed: UID in precondition: not-its-uid"):
        kube.pods.bind("default", "to-bind", "not-its-uid", "node-1")
    with pytest.raises(Conflict, match="Precondition failed: ResourceVersion in precondition: 1,"):
        kube.pods.bind("default", "to-bind", created["uid"], "node-1", resource_version="1")
    kube.pods.bind("default", "to-bind", created["uid"], "node-1", annotations={"example.com/gpu": "0"},
                   resource_version=created["resourceVersion"])
    bound = kube.pods.read("default", "to-bind")
    assert bound["spec"]["nodeName"] == "node-1" and bound["metadata"]["annotations"] == {"example.com/gpu": "0"}
    with pytest.raises(NotFound) as caught:
        kube.pods.bind("default", "ghost", "", "node-1")
    assert str(caught.value) == (f"Could not bind pod default/ghost to node node-1: the API server at {kube.host} "
                                 'answered 404 Not Found (pods "ghost" not found).')
    with pytest.raises(Unavailable, match=r"^There was no time left to bind pod default/ghost to node node-1 "):
        kube.pods.bind("default", "ghost", "", "node-1", timeout_s=0)
    unanswered = connect(kubeconfig(tmp_path / "config", {"silent": silent_url}, "silent"))
    with pytest.raises(Unavailable) as timed_out:
        unanswered.pods.bind("default", "to-bind", created["uid"], "node-1", timeout_s=0.2)
    assert str(timed_out.value) == (f"The API server at {silent_url} did not answer within 0.2 s when asked to bind "
                                    "pod default/to-bind to node node-1; check that the cluster is running and not "
                                    "overloaded.")


def test_a_caller_out_of_time_is_told_so_without_a_request(kube: Kube) -> None:
    with pytest.raises(Unavailable, match=r"^There was no time left to read pod default/p at the API server at "):
        kube.pods.read("default", "p", timeout_s=0)


class _CountingServer(ThreadingHTTPServer):
    """Answers every GET with a pod once ``calls`` requests are waiting together; counts the connections it took."""

    daemon_threads = True

    def __init__(self, calls: int) -> None:
        self.connections = 0
        self.together = threading.Barrier(calls, timeout=10)
        super().__init__(("127.0.0.1", 0), _PodAnswer)

    def get_request(self) -> tuple[socket.socket, Any]:
        self.connections += 1  # accept() runs on the serving thread only
        return super().get_request()


class _PodAnswer(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _CountingServer

    def do_GET(self) -> None:
        self.server.together.wait()
        answer_json(self, b'{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"default"}}')

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize("sized", [True, False])
def test_connections_keeps_that_many_calls_on_open_connections(clean_env: Path, tmp_path: Path, sized: bool) -> None:
    # More calls at once than the client's default pool keeps (five per core), in two rounds.
    calls = 5 * (os.cpu_count() or 1) + 16
    server = _CountingServer(calls)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        config = kubeconfig(tmp_path / "config", {"local": f"http://127.0.0.1:{server.server_port}"}, "local")
        kube = connect(config, connections=calls if sized else None)
        with ThreadPoolExecutor(max_workers=calls) as pool:
            for _ in range(2):
                assert {p["metadata"]["name"] for p in pool.map(lambda _: kube.pods.read("default", "p"),
                                                                 range(calls))} == {"p"}
    finally:
        server.shutdown()
        server.server_close()
    # Sized, the second round reuses the first round's connections; else those past the pool were closed.
    assert (server.connections == calls) is sized
