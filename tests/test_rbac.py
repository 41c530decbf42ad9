"""The chart's RBAC against the calls the code makes: nothing the code calls is missing, nothing granted is unused.

Derived, not listed: each public method of the kube layer (``gpushare.kube.api``'s Pods, Nodes, Leases and
PodGroups) is called against a client whose transport records the HTTP request instead of sending it, and the
request is read as RBAC reads it (API group, resource[/subresource], verb). ``list_call`` is the informer's list and
watch. Then the source of each component is scanned for the kube-layer methods it uses on the ``pods``, ``nodes``,
``leases`` and ``pod_groups`` it was handed. A method added to the kube layer, or a new use of one in a component,
changes the derived set.
"""

from __future__ import annotations

import ast
import re
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from gpushare.kube.api import Kube

ROOT = Path(__file__).resolve().parents[1]
Grant = tuple[str, str, str]  # (API group, resource, verb)
RESOURCES = {"pods": "pods", "_pods": "pods", "nodes": "nodes", "_nodes": "nodes", "leases": "leases",
             "_leases": "leases", "budgets": "budgets", "_budgets": "budgets", "pod_groups": "pod_groups",
             "_pod_groups": "pod_groups"}


class _Recorded(BaseException):
    """Raised by the transport instead of sending; a BaseException, so that no KubeError handling (record_event
    logs its failures) can swallow it."""

    def __init__(self, method: str, url: str) -> None:
        super().__init__(method, url)
        self.method, self.url = method, url


def _grant(method: str, url: str) -> set[Grant]:
    parsed = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qs(parsed.query)
    parts = parsed.path.strip("/").split("/")
    group = "" if parts[0] == "api" else parts[1]
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    resource = rest[0] + ("/" + rest[2] if len(rest) > 2 else "")
    named = len(rest) > 1
    if method == "GET":
        verb = "watch" if query.get("watch") == ["True"] or query.get("watch") == ["true"] else (
            "get" if named else "list")
    else:
        verb = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}[method]
    return {(group, resource, verb)}


def _kube_layer_grants() -> dict[tuple[str, str], set[Grant]]:
    """(resource attribute, method) -> what calling it asks the API server for."""
    api_client = client.ApiClient(client.Configuration(host="http://recorder"))

    def record(method: str, url: str, **_: Any) -> Any:
        raise _Recorded(method, url)

    api_client.rest_client.request = record  # type: ignore[method-assign, assignment]
    kube = Kube.from_api_client(api_client)
    calls: dict[tuple[str, str], list[dict[str, Any]]] = {
        ("pods", "read"): [{"namespace": "ns", "name": "p"}],
        ("pods", "list"): [{}],
        ("pods", "annotate"): [{"namespace": "ns", "name": "p", "resource_version": "1", "annotations": {}}],
        ("pods", "bind"): [{"namespace": "ns", "name": "p", "uid": "u", "node": "n"}],
        ("pods", "record_event"): [{"namespace": "ns", "name": "p", "uid": "u", "reason": "r", "message": "m",
                                    "component": "c"}],
        ("nodes", "read"): [{"name": "n"}],
        ("nodes", "list"): [{}],
        ("nodes", "annotate"): [{"name": "n", "annotations": {}}],
        ("nodes", "patch_status"): [{"name": "n", "status": {}}],
        ("leases", "read"): [{"namespace": "ns", "name": "l"}],
        ("leases", "create"): [{"namespace": "ns", "body": {"metadata": {"name": "l"}}}],
        ("leases", "replace"): [{"namespace": "ns", "name": "l", "body": {}}],
        ("pod_groups", "read"): [{"namespace": "ns", "name": "g"}],
        ("pods", "list_call"): [{"_preload_content": False}, {"_preload_content": False, "watch": True}],
        ("nodes", "list_call"): [{"_preload_content": False}, {"_preload_content": False, "watch": True}],
        ("budgets", "list_call"): [{"_preload_content": False}, {"_preload_content": False, "watch": True}],
    }
    public = {(attr, name) for attr in ("pods", "nodes", "leases", "budgets", "pod_groups")
              for name in dir(getattr(kube, attr))
              if not name.startswith("_") and callable(getattr(getattr(kube, attr), name)) and name != "host"}
    assert public == set(calls), ("the kube layer's methods changed; teach this test how to call "
                                  f"{sorted(public ^ set(calls))}")
    grants: dict[tuple[str, str], set[Grant]] = {}
    for (attr, name), argument_sets in calls.items():
        found: set[Grant] = set()
        for kwargs in argument_sets:
            try:
                getattr(getattr(kube, attr), name)(**kwargs)
            except _Recorded as request:
                found |= _grant(request.method, request.url)
            else:
                pytest.fail(f"{attr}.{name} sent nothing")
        grants[(attr, name)] = found
    return grants


def _uses(package: str) -> set[tuple[str, str]]:
    """(resource, method) of every ``<x>.pods.annotate``-like use, and ``Informer(<x>.pods.list_call)``."""
    used = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                owner = node.value
                name = owner.attr if isinstance(owner, ast.Attribute) else owner.id if isinstance(
                    owner, ast.Name) else None
                if name in RESOURCES:
                    used.add((RESOURCES[name], node.attr))
    return used


def derived(package: str) -> set[Grant]:
    grants = _kube_layer_grants()
    needed: set[Grant] = set()
    for use in _uses(package):
        if use in grants:
            needed |= grants[use]
    return needed


def granted(docs: list[dict[str, Any]], account: str) -> set[Grant]:
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in ("Role", "ClusterRole")}
    out: set[Grant] = set()
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s.get("name") == account for s in binding["subjects"]):
            continue
        role = roles.get((binding["roleRef"]["kind"], binding["roleRef"]["name"]))
        assert role is not None, f"{binding['metadata']['name']} binds a role the chart does not render"
        for rule in role["rules"]:
            out |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return out


@pytest.fixture(scope="module")
def ha_docs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    import subprocess

    out = tmp_path_factory.mktemp("rbac")
    values = out / "rbac-values.yaml"
    values.write_text(yaml.safe_dump({"extender": {"replicas": 2, "insecure": {"acknowledged": True}}}))
    if not (ROOT / ".venv-helm").exists():
        pytest.skip("scripts/check_chart.sh builds .venv-helm; run tests/test_chart.py first")
    result = subprocess.run([str(ROOT / ".venv-helm" / "bin" / "python"), str(ROOT / "scripts" / "render_chart.py"),
                             str(ROOT / "charts" / "gpushare"), str(out / "rendered"), str(values)],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    return [d for f in sorted((out / "rendered" / "rbac").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())
            if d]


def test_the_request_reader_reads_urls_as_rbac_does() -> None:
    assert _grant("POST", "http://h/api/v1/namespaces/ns/bindings") == {("", "bindings", "create")}
    assert _grant("PATCH", "http://h/api/v1/nodes/n/status") == {("", "nodes/status", "patch")}
    assert _grant("GET", "http://h/api/v1/pods?watch=True") == {("", "pods", "watch")}
    assert _grant("PUT", "http://h/apis/coordination.k8s.io/v1/namespaces/ns/leases/l") == {
        ("coordination.k8s.io", "leases", "update")}


@pytest.mark.parametrize(("package", "account"), [("extender", "gpushare-extender"),
                                                  ("deviceplugin", "gpushare-device-plugin")])
def test_rbac_grants_exactly_what_the_code_calls(ha_docs: list[dict[str, Any]], package: str, account: str) -> None:
    needed, given = derived(package), granted(ha_docs, account)
    assert not needed - given, f"{package} calls what the chart does not grant: {sorted(needed - given)}"
    assert not given - needed, f"the chart grants {package} what no code calls: {sorted(given - needed)}"


def test_the_device_plugin_never_binds_or_reads_leases() -> None:
    assert not {g for g in derived("deviceplugin") if g[1] in ("bindings", "leases")}
    assert re.search(r"kube\.leases", (ROOT / "extender" / "app.py").read_text())
