"""The local cluster's pure parts: patch functions and selector parsing."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gpushare.localcluster.errors import ApiError
from gpushare.localcluster.patch import merge_patch, strategic_merge_patch
from gpushare.localcluster.selectors import parse_field_selector, parse_label_selector

POD: dict[str, Any] = {
    "metadata": {"name": "p", "labels": {"a": "1"}},
    "spec": {"containers": [{"name": "main", "image": "x", "env": [{"name": "A", "value": "1"}]},
                            {"name": "side", "image": "y"}]},
}


def test_merge_patch_leaves_the_original_untouched() -> None:
    original = copy.deepcopy(POD)
    patched = merge_patch(POD, {"metadata": {"labels": {"a": None, "b": "2"}}})
    assert patched["metadata"]["labels"] == {"b": "2"}
    assert original == POD
    assert patched["spec"] is POD["spec"]  # untouched parts are shared, not copied


def test_strategic_merge_patch_merges_nested_lists_by_key() -> None:
    patch = {"spec": {"containers": [{"name": "main", "env": [{"name": "B", "value": "2"}]},
                                     {"name": "new", "image": "z"}]}}
    containers = strategic_merge_patch(POD, patch)["spec"]["containers"]
    assert [c["name"] for c in containers] == ["main", "side", "new"]
    assert containers[0]["env"] == [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]
    assert containers[0]["image"] == "x"


def test_strategic_merge_patch_directives() -> None:
    deleted = strategic_merge_patch(POD, {"spec": {"containers": [{"name": "side", "$patch": "delete"}]}})
    assert [c["name"] for c in deleted["spec"]["containers"]] == ["main"]
    replaced = strategic_merge_patch(POD, {"metadata": {"labels": {"$patch": "replace", "z": "9"}}})
    assert replaced["metadata"]["labels"] == {"z": "9"}
    ordered = strategic_merge_patch(POD, {"spec": {"$setElementOrder/containers": [{"name": "side"}]}})
    assert ordered == POD


def test_lists_without_a_merge_key_are_replaced() -> None:
    patched = strategic_merge_patch({"spec": {"tolerations": [{"key": "a"}]}},
                                    {"spec": {"tolerations": [{"key": "b"}]}})
    assert patched["spec"]["tolerations"] == [{"key": "b"}]


@pytest.mark.parametrize("text", ["a in b", "a notin ()", "=x", "a=b c", "a in (b", "a==x=y", "!"])
def test_malformed_label_selectors(text: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_label_selector(text)
    assert caught.value.code == 400 and text.strip() in caught.value.message


def test_label_selector_matching() -> None:
    selector = parse_label_selector("app in (web, db),tier!=back,!legacy,env")
    labels = {"app": "web", "tier": "front", "env": "prod"}
    assert selector.matches(labels.get)
    assert not selector.matches({**labels, "legacy": "yes"}.get)
    assert not selector.matches({**labels, "tier": "back"}.get)
    assert not selector.matches({"app": "web"}.get)


def test_field_selector_escapes_and_pinned_values() -> None:
    selector = parse_field_selector(r"metadata.name=a\,b,spec.nodeName==n1", ["metadata.name", "spec.nodeName"])
    assert selector.matches({"metadata.name": "a,b", "spec.nodeName": "n1"}.get)
    assert selector.equals("spec.nodeName") == "n1"
    with pytest.raises(ApiError, match="is not of the form"):
        parse_field_selector("metadata.name", ["metadata.name"])
