"""kube-scheduler's PodDisruptionBudget rule for preemption victims (gpushare.disruption), and its parsing."""

from __future__ import annotations

from gpushare.disruption import Budget, Candidate, Requirement, count_violations, label_selector, violating
from gpushare.kube.convert import budget_info


def pod(name: str, namespace: str = "ns", **labels: str) -> Candidate:
    return Candidate(namespace, name, labels)


def budget(allowed: int, selector: object, namespace: str = "ns", disrupted: tuple[str, ...] = ()) -> Budget:
    return Budget(namespace, "b", label_selector(selector), allowed, frozenset(disrupted))


def test_a_budget_absorbs_as_many_victims_as_it_allows_in_the_order_given() -> None:
    web = {"matchLabels": {"app": "web"}}
    victims = [pod("a", app="web"), pod("b", app="web"), pod("c", app="db"), pod("d", app="web")]
    assert violating(victims, [budget(1, web)]) == [False, True, False, True]
    assert count_violations(victims, [budget(3, web)]) == 0
    assert count_violations(victims, [budget(0, web)]) == 3


def test_what_a_budget_does_not_cover() -> None:
    web = {"matchLabels": {"app": "web"}}
    assert violating([pod("a", "other", app="web")], [budget(0, web)]) == [False]  # another namespace
    assert violating([pod("a")], [budget(0, web)]) == [False]  # no labels
    assert violating([pod("a", app="web")], [budget(0, web, disrupted=("a",))]) == [False]  # already counted
    assert violating([pod("a", app="web")], [budget(0, {})]) == [False]  # empty selector: nothing
    assert violating([pod("a", app="web")], [budget(0, None)]) == [False]
    assert violating([pod("a", app="web")], [budget(0, {"matchExpressions": [{"key": "app", "operator": "Bad"}]})]
                     ) == [False]  # invalid: nothing


def test_each_matching_budget_is_charged() -> None:
    budgets = [budget(1, {"matchLabels": {"app": "web"}}), budget(0, {"matchLabels": {"tier": "front"}})]
    assert violating([pod("a", app="web"), pod("b", app="web", tier="front")], budgets) == [False, True]


def test_match_expressions() -> None:
    selector = label_selector({"matchExpressions": [
        {"key": "app", "operator": "In", "values": ["web", "api"]},
        {"key": "canary", "operator": "DoesNotExist"},
        {"key": "tier", "operator": "NotIn", "values": ["batch"]},
        {"key": "team", "operator": "Exists"}]})
    assert selector is not None
    assert selector.expressions[0] == Requirement("app", "In", frozenset({"web", "api"}))
    assert selector.matches({"app": "api", "team": "x"})
    assert not selector.matches({"app": "api", "team": "x", "canary": "1"})
    assert not selector.matches({"app": "api", "team": "x", "tier": "batch"})
    assert not selector.matches({"app": "db", "team": "x"})
    assert not selector.matches({"app": "web"})
    assert label_selector({"matchExpressions": [{"key": "a", "operator": "In"}]}) is None
    assert label_selector({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}) is None
    assert label_selector("app=web") is None


def test_budget_info_reads_the_api_object() -> None:
    read = budget_info({"metadata": {"namespace": "team", "name": "web"},
                        "spec": {"selector": {"matchLabels": {"app": "web"}}},
                        "status": {"disruptionsAllowed": 2, "disruptedPods": {"web-1": "2026-11-23T10:00:00Z"}}})
    assert (read.namespace, read.name, read.disruptions_allowed, read.disrupted_pods) == ("team", "web", 2,
                                                                                           frozenset({"web-1"}))
    assert read.selector is not None and read.selector.matches({"app": "web"})
    assert budget_info({"metadata": {"name": "x"}, "status": {"disruptionsAllowed": "2"}}).disruptions_allowed == 0
