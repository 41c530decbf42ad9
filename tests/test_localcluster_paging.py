"""Paged lists, list resource versions and watch start points, as a real API server serves them."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import cluster_spec
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpushare.localcluster import LocalCluster

PODS = "/api/v1/namespaces/default/pods"


@pytest.fixture
def small_window() -> Iterator[LocalCluster]:
    """A cluster whose kinds keep only 5 changes of history, so that old versions expire quickly."""
    with LocalCluster(cluster_spec(), event_window=5) as cluster:
        yield cluster


@pytest.fixture
def core(small_window: LocalCluster) -> client.CoreV1Api:
    return client.CoreV1Api(small_window.api_client())


@pytest.fixture
def http(small_window: LocalCluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=small_window.url, timeout=10) as session:
        yield session


def make_pods(core: client.CoreV1Api, names: list[str]) -> None:
    for name in names:
        core.create_namespaced_pod("default", {"metadata": {"name": name},
                                               "spec": {"containers": [{"name": "c", "image": "i"}]}})


def names(items: list[Any]) -> list[str]:
    return [p.metadata.name for p in items]


def test_pages_are_a_consistent_snapshot_of_the_first_pages_version(core: client.CoreV1Api) -> None:
    make_pods(core, ["a", "b", "c", "d"])
    first = core.list_namespaced_pod("default", limit=2)
    assert names(first.items) == ["a", "b"]
    assert first.metadata.remaining_item_count == 2
    core.delete_namespaced_pod("c", "default")  # changes after the first page do not show in the next ones
    make_pods(core, ["bb"])
    second = core.list_namespaced_pod("default", limit=2, _continue=first.metadata._continue)
    assert names(second.items) == ["c", "d"]
    assert second.metadata.resource_version == first.metadata.resource_version
    assert not second.metadata._continue and second.metadata.remaining_item_count is None
    assert names(core.list_namespaced_pod("default").items) == ["a", "b", "bb", "d"]


def test_nodes_page_too(core: client.CoreV1Api) -> None:
    first = core.list_node(limit=1)
    second = core.list_node(limit=1, _continue=first.metadata._continue)
    assert names(first.items) + names(second.items) == ["node-0", "node-1"]
    assert second.metadata._continue is None


def test_an_expired_continue_token_is_gone_with_a_token_for_the_rest(core: client.CoreV1Api) -> None:
    make_pods(core, ["a", "b", "c"])
    first = core.list_namespaced_pod("default", limit=1)
    make_pods(core, [f"x{i}" for i in range(6)])  # more changes than the window keeps
    with pytest.raises(ApiException) as caught:
        core.list_namespaced_pod("default", limit=1, _continue=first.metadata._continue)
    status = json.loads(caught.value.body)
    assert (caught.value.status, status["reason"]) == (410, "Expired")
    assert status["message"].startswith("The provided continue parameter is too old to display a consistent list "
                                        "result. You can start a new list without the continue parameter, or use "
                                        "the continue token in this response")
    rest = core.list_namespaced_pod("default", limit=100, _continue=status["metadata"]["continue"])
    assert names(rest.items) == ["b", "c", "x0", "x1", "x2", "x3", "x4", "x5"]  # the latest state, after "a"


def test_list_at_an_exact_version_and_not_older_than(core: client.CoreV1Api) -> None:
    make_pods(core, ["a"])
    version = core.list_namespaced_pod("default").metadata.resource_version
    make_pods(core, ["b"])
    exact = core.list_namespaced_pod("default", resource_version=version, resource_version_match="Exact")
    assert (names(exact.items), exact.metadata.resource_version) == (["a"], version)
    newer = core.list_namespaced_pod("default", resource_version=version, resource_version_match="NotOlderThan")
    assert names(newer.items) == ["a", "b"] and int(newer.metadata.resource_version) > int(version)
    assert names(core.list_namespaced_pod("default", resource_version="0", limit=1).items) == ["a", "b"]


def test_an_exact_version_older_than_the_history_is_gone(core: client.CoreV1Api) -> None:
    version = core.list_namespaced_pod("default").metadata.resource_version
    make_pods(core, [f"x{i}" for i in range(6)])
    with pytest.raises(ApiException) as caught:
        core.list_namespaced_pod("default", resource_version=version, resource_version_match="Exact")
    assert caught.value.status == 410
    assert json.loads(caught.value.body)["message"] == "The resourceVersion for the provided list is too old."


def test_a_version_from_the_future_times_out_as_too_large(http: httpx.Client) -> None:
    current = int(http.get(PODS).json()["metadata"]["resourceVersion"])
    started = time.monotonic()
    response = http.get(PODS, params={"resourceVersion": str(current + 100), "resourceVersionMatch": "NotOlderThan"})
    assert time.monotonic() - started >= 2.9  # the watch cache waits 3 s for the version to arrive
    status = response.json()
    assert (response.status_code, status["reason"]) == (504, "Timeout")
    assert status["message"] == f"Timeout: Too large resource version: {current + 100}, current: {current}"
    assert status["details"]["causes"] == [{"reason": "ResourceVersionTooLarge",
                                            "message": "Too large resource version"}]


@pytest.mark.parametrize(("params", "message"), [
    ({"resourceVersionMatch": "Exact"},
     'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden '
     "unless resourceVersion is provided"),
    ({"resourceVersion": "1", "resourceVersionMatch": "Newest"},
     'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Unsupported value: "Newest": supported values: '
     '"Exact", "NotOlderThan", ""'),
    ({"resourceVersion": "0", "resourceVersionMatch": "Exact"},
     'resourceVersionMatch: Forbidden: resourceVersionMatch "exact" is forbidden for resourceVersion "0"'),
    ({"sendInitialEvents": "true"}, "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list"),
    ({"watch": "true", "sendInitialEvents": "true"},
     "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"),
])
def test_list_options_are_validated(http: httpx.Client, params: dict[str, str], message: str) -> None:
    response = http.get(PODS, params=params)
    assert (response.status_code, response.json()["reason"]) == (422, "Invalid")
    assert message in response.json()["message"]


@pytest.mark.parametrize(("params", "words"), [
    ({"limit": "1", "continue": "not-a-token"}, "invalid continue token"),
    ({"limit": "1", "continue": "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MSwic3RhcnQiOiJhXHUwMDAwIn0",
      "resourceVersion": "5"}, "specifying resource version is not allowed when using continue"),
])
def test_bad_continue_requests_are_bad_requests(http: httpx.Client, params: dict[str, str], words: str) -> None:
    response = http.get(PODS, params=params)
    assert (response.status_code, response.json()["reason"]) == (400, "BadRequest")
    assert words in response.json()["message"]


def watch_lines(http: httpx.Client, params: dict[str, str], count: int) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    with http.stream("GET", PODS, params={"watch": "true", "timeoutSeconds": "2", **params}) as response:
        for line in response.iter_lines():
            lines.append(json.loads(line))
            if len(lines) == count:
                break
    return lines


def test_send_initial_events_ends_with_the_annotated_bookmark(core: client.CoreV1Api, http: httpx.Client) -> None:
    make_pods(core, ["a", "b"])
    events = watch_lines(http, {"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan",
                                "allowWatchBookmarks": "true"}, 3)
    assert [(e["type"], e["object"]["metadata"].get("name")) for e in events] == [
        ("ADDED", "a"), ("ADDED", "b"), ("BOOKMARK", None)]
    assert events[2]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_a_watch_from_a_future_version_starts_when_it_arrives(core: client.CoreV1Api, http: httpx.Client) -> None:
    current = int(http.get(PODS).json()["metadata"]["resourceVersion"])
    with http.stream("GET", PODS, params={"watch": "true", "timeoutSeconds": "3",
                                          "resourceVersion": str(current + 1)}) as response:
        make_pods(core, ["early", "late"])  # versions current+1 and current+2: only the second is after
        events = [json.loads(line) for line in response.iter_lines()]
    assert [e["object"]["metadata"]["name"] for e in events] == ["late"]
