"""Prioritize's answer: policy scores onto kube-scheduler's 0..10, written as a HostPriorityList."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.wire import host_priority_list
from gpushare.policies import extender_scores, favourite, favourite_of_states, node_priority

NODE_NAMES = st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,20}[a-z0-9])?", fullmatch=True)
RAW_SCORES = st.dictionaries(NODE_NAMES, st.sampled_from([-3.5, 0.0, 0.25, 1.0, 7.0, 1e6]) | st.floats(-1e3, 1e3),
                             max_size=60)


@settings(max_examples=300, deadline=None)
@given(RAW_SCORES, st.integers(0, 3))
def test_every_node_gets_one_score_and_only_the_favourite_gets_ten(raw: dict[str, float], seed: int) -> None:
    answer = orjson.loads(host_priority_list(extender_scores(raw, seed)))
    scores = {entry["Host"]: entry["Score"] for entry in answer}
    assert len(answer) == len(scores) == len(raw) and scores.keys() == raw.keys()
    assert all(type(s) is int and 0 <= s <= 10 for s in scores.values())
    if not raw:
        return
    best = max(raw, key=lambda name: (raw[name], node_priority(name, seed)))
    assert [name for name, s in scores.items() if s == 10] == [best]
    assert favourite(raw, seed) == best  # what filter passes when it chooses is what prioritize gives 10
    others = sorted((raw[name], s) for name, s in scores.items() if name != best)
    assert [s for _, s in others] == sorted(s for _, s in others)  # a better raw score never ranks lower


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(NODE_NAMES, st.integers(0, 5)), unique_by=lambda pair: pair[0], max_size=60),
       st.dictionaries(st.integers(0, 5), st.none() | st.sampled_from([-3.5, 0.0, 1.0, 7.0]) | st.floats(-1e3, 1e3)),
       st.integers(0, 3))
def test_the_favourite_of_nodes_scored_per_state_is_the_favourite_of_their_scores(
        nodes: list[tuple[str, int]], by_state: dict[int, float | None], seed: int) -> None:
    """Filter scores each state of its window once; the node it passes must be the one per-node scores choose."""
    names = [name for name, _ in nodes]
    states = [state for _, state in nodes]
    scores = {state: by_state.get(state) for state in states}  # every state of the window has its answer
    per_node = {name: score for name, state in nodes if (score := scores[state]) is not None}
    expected = favourite(per_node, seed) if per_node else None
    assert favourite_of_states(names, states, scores, seed) == expected


def test_an_empty_group_writes_nothing() -> None:
    assert orjson.loads(host_priority_list({0: [], 10: ["gpu-1"]})) == [{"Host": "gpu-1", "Score": 10}]
    assert host_priority_list({}) == b"[]"
