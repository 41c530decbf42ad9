"""The target workload that fragmentation is measured against, learned from the pods the scheduler sees.

FGD asks "how much idle GPU memory could the pods we expect next not use?". The pods we expect next are a
probability distribution over task shapes (GPU count, per-GPU share, CPU, accepted models). The extender
learns it online: every pod it sees is added to a histogram whose older entries decay with a half-life, so
the distribution follows a drifting workload. It can be seeded from a file (for example one derived from a
trace with ``bench/workload_seed.py``) so that a freshly started extender already knows what to expect.

The target used for scoring is rebuilt from the histogram every ``refresh_every`` observations and adopted
only when it moved by more than ``tolerance`` (total variation distance). Scores therefore stay stable
between refreshes, which lets callers cache them against ``version``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path

import yaml

from gpushare.contract import MAX_GPU_COUNT, ModelRule, PodRequest
from gpushare.quantity import INT64_MAX

# Per observation the newest weight grows by 2**(1/half_life); rescale before floats lose precision.
_RESCALE_ABOVE = 1e12
# Distinct shapes the histogram keeps. Real workloads have tens to a few hundred (the openb trace: about 100); a
# new shape beyond this replaces the lightest one, so no stream of odd pods can grow the model without bound.
MAX_SHAPES = 512
# A seed's total weight counts as at most this many pods, so a seed file cannot pin the model forever.
MAX_SEED_OBSERVATIONS = 1e9


def share_class(per_gpu: int) -> int:
    """``per_gpu`` cut to two significant digits (1234 -> 1200, 999 -> 990, 85 -> 85): the share the target keeps.

    Pods that ask GPU memory in MiB each ask an amount of their own, and kept exactly every pod would be a demand of
    its own: the target would hold up to ``MAX_SHAPES`` of them, and F's GPU side of a node lists every demand, so
    each scoring costs in proportion (a trace whose sharing pods drew their share from 50-999 units: 178 us per
    evaluation against 59 with two digits). Rounding down keeps a class within a tenth below what its pods ask and
    never makes one look as if it could not fit where they do. openb's shares (50-810 in steps of 10, whole GPUs of
    1,000) and shares in GiB (below 100) have at most two digits, so their targets do not move. Only the target is
    rounded: a pod's own fit, GPU choice and score read its exact request.
    """
    step = 1
    while per_gpu >= 100 * step:
        step *= 10
    return per_gpu // step * step


@dataclass(frozen=True, slots=True)
class Shape:
    """What a pod needs, as far as fragmentation is concerned. Memory units are absolute (GiB or MiB of GPU
    memory), so a 4 GiB task needs 4 GiB free whatever the size of the card."""

    gpu_count: int
    per_gpu: int
    cpu_milli: int = 0
    exclusive: bool = False
    models: ModelRule = field(default_factory=ModelRule)

    @classmethod
    def of(cls, request: PodRequest) -> Shape:
        rule = request.models
        models = ModelRule(tuple(sorted(set(rule.include))), tuple(sorted(set(rule.exclude))), rule.substring)
        return cls(request.gpu_count, share_class(request.per_gpu), request.cpu_milli, request.exclusive, models)

    def sort_key(self) -> tuple[int, int, int, bool, tuple[str, ...], tuple[str, ...], bool]:
        return (self.gpu_count, self.per_gpu, self.cpu_milli, self.exclusive, self.models.include,
                self.models.exclude, self.models.substring)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"gpuCount": self.gpu_count, "perGPU": self.per_gpu, "cpuMilli": self.cpu_milli}
        if self.exclusive:
            out["exclusive"] = True
        if self.models.include:
            out["models"] = "|".join(self.models.include)
        if self.models.exclude:
            out["excludeModels"] = "|".join(self.models.exclude)
        if self.models.substring:
            out["substring"] = True
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Shape:
        def names(key: str) -> tuple[str, ...]:
            text = str(data.get(key) or "")
            return tuple(sorted({p.strip().lower() for p in text.replace(",", "|").split("|") if p.strip()}))

        def number(key: str) -> int:
            value = data.get(key, 0)
            if not isinstance(value, int | float | str) or isinstance(value, bool):
                raise ValueError(f"{key} must be a number, not {value!r}")
            return int(value)

        gpu_count, per_gpu, cpu_milli = number("gpuCount"), number("perGPU"), number("cpuMilli")
        if gpu_count < 0 or per_gpu < 0 or cpu_milli < 0:
            raise ValueError(f"negative amounts in {dict(data)}")
        if gpu_count > MAX_GPU_COUNT or max(per_gpu, cpu_milli) > INT64_MAX:
            raise ValueError(f"gpuCount must be at most {MAX_GPU_COUNT} and perGPU and cpuMilli at most {INT64_MAX}")
        return cls(gpu_count=gpu_count, per_gpu=share_class(per_gpu), cpu_milli=cpu_milli,
                   exclusive=bool(data.get("exclusive", False)),
                   models=ModelRule(names("models"), names("excludeModels"), bool(data.get("substring", False))))


Target = tuple[tuple[Shape, float], ...]


class WorkloadDistribution:
    """A decayed histogram of task shapes, and the target workload derived from it.

    ``target`` holds the most frequent shapes that together cover at least ``coverage`` of the weight, each
    with its probability (its share of all the weight, so the probabilities sum to roughly ``coverage``).
    """

    def __init__(self, half_life: float = 5000.0, coverage: float = 0.95, refresh_every: int = 500,
                 tolerance: float = 0.02) -> None:
        if half_life <= 0 or not 0 < coverage <= 1 or refresh_every <= 0 or tolerance < 0:
            raise ValueError("half_life and refresh_every must be positive, coverage in (0, 1], tolerance >= 0.")
        self.coverage = coverage
        self.refresh_every = refresh_every
        self.tolerance = tolerance
        self._growth = 2.0 ** (1.0 / half_life)
        self._increment = 1.0
        self._weights: dict[Shape, float] = {}
        self._observed = 0
        self._refreshed_at = 0
        self._target: Target = ()
        self.version = 0

    def seed(self, weights: Mapping[Shape, float], observations: float = 1.0) -> None:
        """Add a known distribution as if ``observations`` pods with these relative weights had been seen."""
        weights = {s: w for s, w in weights.items() if math.isfinite(w) and w > 0}
        total = sum(weights.values())
        if total <= 0 or not math.isfinite(total):
            raise ValueError("A workload seed needs at least one shape with a positive, finite weight.")
        observations = min(observations, MAX_SEED_OBSERVATIONS)
        for shape, weight in weights.items():
            self._weights[shape] = self._weights.get(shape, 0.0) + weight / total * observations * self._increment
        # A seed counts as that many observations, so the quick refreshes of a cold start are skipped.
        self._observed += max(round(observations), 1)
        self._refreshed_at = self._observed
        self._adopt(self._build())

    def observe(self, shape: Shape) -> None:
        if shape not in self._weights and len(self._weights) >= MAX_SHAPES:
            # The lightest shape found over the items, not by looking each key up: a Shape's hash is worked out in
            # Python on every lookup, and with every pod a shape of its own (each its own CPU) the lookups of a full
            # histogram took a fifth of each filter.
            del self._weights[min(self._weights.items(), key=itemgetter(1))[0]]
        self._increment *= self._growth
        self._weights[shape] = self._weights.get(shape, 0.0) + self._increment
        if self._increment > _RESCALE_ABOVE:
            self._weights = {s: w / self._increment for s, w in self._weights.items()}
            self._increment = 1.0
        self._observed += 1
        # Refresh after 1, 2, 4, ... observations, then every refresh_every: a cold start learns fast.
        if self._observed - self._refreshed_at >= min(self.refresh_every, max(self._refreshed_at, 1)):
            self._refreshed_at = self._observed
            candidate = self._build()
            if _distance(candidate, self._target) > self.tolerance:
                self._adopt(candidate)

    @property
    def target(self) -> Target:
        return self._target

    def histogram(self) -> dict[Shape, float]:
        """Every shape seen, with its current (decayed) probability."""
        total = sum(self._weights.values())
        return {s: w / total for s, w in self._weights.items()} if total else {}

    def _build(self) -> Target:
        ranked = sorted(self.histogram().items(), key=lambda item: (-item[1], item[0].sort_key()))
        chosen: list[tuple[Shape, float]] = []
        covered = 0.0
        for shape, probability in ranked:
            if covered >= self.coverage - 1e-12:
                break
            chosen.append((shape, probability))
            covered += probability
        return tuple(chosen)

    def _adopt(self, target: Target) -> None:
        self._target = target
        self.version += 1


def _distance(a: Target, b: Target) -> float:
    """Total variation distance between two targets (shapes missing from one count as probability 0)."""
    pa, pb = dict(a), dict(b)
    return 0.5 * sum(abs(pa.get(s, 0.0) - pb.get(s, 0.0)) for s in pa.keys() | pb.keys())


def load_workload(path: str | Path) -> dict[Shape, float]:
    """Read a seed file: YAML or JSON ``{"shapes": [{"gpuCount": 1, "perGPU": 460, "cpuMilli": 6000,
    "models": "V100M16|V100M32", "weight": 12}, ...]}``."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"Cannot read the workload seed {path}: {exc.strerror}.") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"The workload seed {path} is not valid YAML or JSON: {exc}.") from None
    shapes = data.get("shapes") if isinstance(data, dict) else None
    if not isinstance(shapes, list) or not shapes:
        raise ValueError(f"The workload seed {path} needs a non-empty list under 'shapes'.")
    weights: dict[Shape, float] = {}
    for i, entry in enumerate(shapes):
        try:
            if not isinstance(entry, dict):
                raise ValueError("not a mapping")
            weight = float(entry.get("weight", 1.0))
            if not 0 <= weight <= MAX_SEED_OBSERVATIONS:
                raise ValueError(f"weight must be a number from 0 to {MAX_SEED_OBSERVATIONS:g}")
            shape = Shape.from_json(entry)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"Shape {i} of the workload seed {path} is invalid ({exc}); see docs/policies.md.") \
                from None
        weights[shape] = weights.get(shape, 0.0) + weight
    return weights


def dump_workload(weights: Mapping[Shape, float]) -> str:
    """The YAML text of a seed file, most frequent shapes first."""
    ranked = sorted(weights.items(), key=lambda item: (-item[1], item[0].sort_key()))
    return yaml.safe_dump({"shapes": [{**s.to_json(), "weight": round(w, 6)} for s, w in ranked]},
                          sort_keys=False)


def count_shapes(requests: Iterable[PodRequest]) -> dict[Shape, float]:
    """A histogram of the shapes of ``requests``."""
    counts: dict[Shape, float] = {}
    for request in requests:
        shape = Shape.of(request)
        counts[shape] = counts.get(shape, 0.0) + 1.0
    return counts
