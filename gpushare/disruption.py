"""PodDisruptionBudgets as kube-scheduler's preemption reads them: which victims would violate one.

kube-scheduler's DefaultPreemption (``filterPodsWithPDBViolation``) walks a node's victims, most important
first, and charges each to every budget of its namespace whose selector matches its labels, unless the pod is
already in the budget's ``status.disruptedPods`` (the API server has counted its eviction). A budget's
``status.disruptionsAllowed`` is what it can absorb: a pod that drives a budget below zero is a violating
victim. A budget with an empty or invalid selector matches nothing, and so does a pod without labels.
The extender counts its own victim sets the same way, so the number it returns to kube-scheduler
(``NumPDBViolations``) is the one kube-scheduler would have computed for them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Requirement:
    """One ``matchExpressions`` entry: ``In``, ``NotIn``, ``Exists`` or ``DoesNotExist``."""

    key: str
    operator: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "In":
            return labels.get(self.key) in self.values
        if self.operator == "NotIn":
            return labels.get(self.key) not in self.values
        if self.operator == "Exists":
            return self.key in labels
        return self.key not in labels  # DoesNotExist


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A ``metav1.LabelSelector``; ``empty`` selectors match nothing here, as a budget's do."""

    match_labels: Mapping[str, str] = field(default_factory=dict)
    expressions: tuple[Requirement, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.match_labels and not self.expressions

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.empty:
            return False
        return (all(labels.get(k) == v for k, v in self.match_labels.items())
                and all(r.matches(labels) for r in self.expressions))


_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def label_selector(obj: object) -> LabelSelector | None:
    """The selector a JSON ``metav1.LabelSelector`` describes; ``None`` where it is invalid (matches nothing)."""
    if obj is None:
        return LabelSelector()
    if not isinstance(obj, dict):
        return None
    labels = obj.get("matchLabels") or {}
    expressions = obj.get("matchExpressions") or []
    if not isinstance(labels, dict) or not isinstance(expressions, list):
        return None
    requirements = []
    for entry in expressions:
        if not isinstance(entry, dict) or entry.get("operator") not in _OPERATORS:
            return None
        values = entry.get("values") or []
        if not isinstance(values, list) or not isinstance(entry.get("key"), str):
            return None
        # In and NotIn need values; Exists and DoesNotExist take none (LabelSelectorAsSelector's checks).
        if (entry["operator"] in ("In", "NotIn")) != bool(values):
            return None
        requirements.append(Requirement(entry["key"], entry["operator"], frozenset(str(v) for v in values)))
    return LabelSelector({str(k): str(v) for k, v in labels.items()}, tuple(requirements))


@dataclass(frozen=True, slots=True)
class Budget:
    """What preemption needs of one PodDisruptionBudget."""

    namespace: str
    name: str
    selector: LabelSelector | None
    disruptions_allowed: int
    disrupted_pods: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Candidate:
    """A pod that may be evicted: its namespace, name and labels."""

    namespace: str
    name: str
    labels: Mapping[str, str]

    @classmethod
    def of(cls, key: str, labels: Mapping[str, str]) -> Candidate:
        """The candidate for a pod key ``namespace/name``."""
        namespace, _, name = key.partition("/")
        return cls(namespace, name, labels)


def violating(victims: Sequence[Candidate], budgets: Iterable[Budget]) -> list[bool]:
    """For each victim, in the order given (most important first), whether evicting it violates a budget."""
    relevant = [(b, b.selector) for b in budgets if b.selector is not None and not b.selector.empty]
    allowed = [b.disruptions_allowed for b, _ in relevant]
    out = []
    for victim in victims:
        violated = False
        if victim.labels:
            for i, (budget, selector) in enumerate(relevant):
                if budget.namespace != victim.namespace or not selector.matches(victim.labels):
                    continue
                if victim.name in budget.disrupted_pods:
                    continue
                allowed[i] -= 1
                if allowed[i] < 0:
                    violated = True
        out.append(violated)
    return out


def count_violations(victims: Sequence[Candidate], budgets: Iterable[Budget]) -> int:
    return sum(violating(victims, budgets))
