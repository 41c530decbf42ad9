"""Placement policies: pure functions of a node's state and a pod's request.

A policy answers one question per node: can this pod run here, and if so on which GPUs and how good is
that (``Candidate``)? The extender's filter passes only the ``favourite`` of the nodes that fit, or its prioritize
turns their scores into kube-scheduler's 0-10 scale with ``extender_scores`` (the favourite alone gets 10); its
bind asks the same policy again on the fresh state to choose the GPUs.
The trace replay in ``bench/`` calls exactly these functions.
"""

from __future__ import annotations

from gpushare.policies.base import (
    Candidate,
    Policy,
    best_states,
    choose_node,
    extender_scores,
    favourite,
    favourite_of_states,
    highest_priority,
    node_priority,
)
from gpushare.policies.registry import DEFAULT_POLICY, make_policy, policy_names

__all__ = [
    "DEFAULT_POLICY",
    "Candidate",
    "Policy",
    "best_states",
    "choose_node",
    "extender_scores",
    "favourite",
    "favourite_of_states",
    "highest_priority",
    "make_policy",
    "node_priority",
    "policy_names",
]
