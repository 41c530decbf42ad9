"""The learned workload distribution: decay, coverage, refreshes, and seed files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.contract import ModelRule, PodRequest
from gpushare.policies.workload import (
    Shape,
    WorkloadDistribution,
    count_shapes,
    dump_workload,
    load_workload,
    share_class,
)
from gpushare.quantity import INT64_MAX

SMALL = Shape(1, 250, cpu_milli=4000)
WHOLE = Shape(1, 1000, cpu_milli=12000)
CPU_ONLY = Shape(0, 0, cpu_milli=8000)


def test_older_observations_decay_with_the_half_life() -> None:
    distribution = WorkloadDistribution(half_life=10, refresh_every=1)
    for _ in range(10):
        distribution.observe(SMALL)
    for _ in range(10):
        distribution.observe(WHOLE)
    histogram = distribution.histogram()
    # The ten older observations weigh half as much as the ten newer ones.
    assert histogram[WHOLE] == pytest.approx(2 / 3, rel=0.05)
    assert histogram[SMALL] == pytest.approx(1 / 3, rel=0.05)


def test_decay_survives_very_long_runs() -> None:
    distribution = WorkloadDistribution(half_life=1, refresh_every=1000)
    for _ in range(200):
        distribution.observe(SMALL)
    distribution.observe(WHOLE)
    assert distribution.histogram()[WHOLE] == pytest.approx(0.5, rel=0.01)


def test_the_target_keeps_the_most_frequent_shapes_up_to_the_coverage() -> None:
    distribution = WorkloadDistribution(coverage=0.9)
    distribution.seed({SMALL: 60, WHOLE: 35, CPU_ONLY: 5})
    assert distribution.target == ((SMALL, 0.6), (WHOLE, 0.35))
    everything = WorkloadDistribution(coverage=1.0)
    everything.seed({SMALL: 60, WHOLE: 35, CPU_ONLY: 5})
    assert [s for s, _ in everything.target] == [SMALL, WHOLE, CPU_ONLY]


def test_the_target_changes_only_at_refreshes_and_when_it_moved() -> None:
    distribution = WorkloadDistribution(half_life=1000, refresh_every=50, tolerance=0.05)
    distribution.seed({SMALL: 1.0}, observations=100)
    version = distribution.version
    for _ in range(49):
        distribution.observe(WHOLE)
    assert distribution.version == version, "no refresh before refresh_every observations"
    distribution.observe(WHOLE)
    assert distribution.version == version + 1
    assert {s for s, _ in distribution.target} == {SMALL, WHOLE}
    steady = WorkloadDistribution(refresh_every=10, tolerance=0.05)
    steady.seed({SMALL: 1.0, WHOLE: 1.0}, observations=1000)
    version = steady.version
    for i in range(100):
        steady.observe(SMALL if i % 2 else WHOLE)
    assert steady.version == version, "a target that did not move is kept"


def test_a_cold_start_learns_after_the_first_pod() -> None:
    distribution = WorkloadDistribution(refresh_every=500)
    distribution.observe(WHOLE)
    assert distribution.target == ((WHOLE, 1.0),)
    distribution.observe(SMALL)
    assert {s for s, _ in distribution.target} == {SMALL, WHOLE}


def test_shapes_of_requests_ignore_model_order_and_duplicates() -> None:
    a = PodRequest(per_gpu=4, cpu_milli=1000, models=ModelRule(("v100m32", "v100m16", "v100m32")))
    b = PodRequest(per_gpu=4, cpu_milli=1000, memory_mib=99, models=ModelRule(("v100m16", "v100m32")))
    assert Shape.of(a) == Shape.of(b)
    assert count_shapes([a, b]) == {Shape.of(a): 2.0}


@given(st.integers(min_value=0, max_value=INT64_MAX))
def test_a_share_class_is_two_digits_at_most_a_tenth_below_the_share(share: int) -> None:
    kept = share_class(share)
    assert kept <= share and 10 * share < 11 * kept + 10  # in integers: within a tenth below (equal under 100)
    assert len(str(kept).rstrip("0")) <= 2 or kept < 100
    assert share_class(kept) == kept


def test_openb_shares_and_gib_shares_keep_their_value() -> None:
    # openb's GPU shares: 50-810 thousandths of a GPU in steps of 10, whole GPUs of 1,000; shares in GiB are small.
    for share in (*range(0, 100), *range(100, 1001, 10), 16, 80, 2000, 8000):
        assert share_class(share) == share


def test_pods_asking_their_own_mib_amounts_make_few_target_shapes() -> None:
    # Sharing pods on 16 GiB cards, each asking its own amount: 3,000-3,099 MiB is one class, 16,384 counts as 16,000.
    requests = [PodRequest(per_gpu=3000 + i, cpu_milli=1000) for i in range(100)] + [PodRequest(per_gpu=16384)]
    assert count_shapes(requests) == {Shape(1, 3000, cpu_milli=1000): 100.0, Shape(1, 16000): 1.0}
    distribution = WorkloadDistribution()
    for request in requests[:100]:
        distribution.observe(Shape.of(request))
    assert [shape for shape, _ in distribution.target] == [Shape(1, 3000, cpu_milli=1000)]
    # A seed file's shares are cut the same way, so seeded and learned shapes meet.
    assert Shape.from_json({"gpuCount": 1, "perGPU": 3072, "cpuMilli": 1000}) == Shape(1, 3000, cpu_milli=1000)


def test_seed_files_round_trip_in_yaml_and_json(tmp_path: Path) -> None:
    weights = {SMALL: 3.0, Shape(2, 1000, cpu_milli=16000, models=ModelRule(("g2", "g3"))): 1.0,
               Shape(1, 8, exclusive=True, models=ModelRule((), ("t4",), substring=True)): 0.5}
    yaml_file = tmp_path / "seed.yaml"
    yaml_file.write_text(dump_workload(weights))
    assert load_workload(yaml_file) == weights
    json_file = tmp_path / "seed.json"
    json_file.write_text(json.dumps({"shapes": [
        {"gpuCount": 1, "perGPU": 250, "cpuMilli": 4000, "weight": 3},
        {"gpuCount": 2, "perGPU": 1000, "cpuMilli": 16000, "models": "G3|G2", "weight": 1}]}))
    loaded = load_workload(json_file)
    assert loaded[SMALL] == 3.0 and loaded[Shape(2, 1000, 16000, models=ModelRule(("g2", "g3")))] == 1.0
    distribution = WorkloadDistribution()
    distribution.seed(loaded)
    assert distribution.target[0] == (SMALL, 0.75)


@pytest.mark.parametrize(("text", "message"), [
    ("shapes: []", "needs a non-empty list under 'shapes'"),
    ("{not yaml", "is not valid YAML or JSON"),
    ("shapes: [{gpuCount: one}]", "Shape 0 of the workload seed .* is invalid"),
    ("shapes: [{gpuCount: 1, perGPU: 5, weight: -1}]", "Shape 0 .*weight must be a number from 0 to"),
    ("shapes: [{gpuCount: -1}]", "Shape 0 .*negative amounts"),
    # Checked before the share is cut to two digits, which would bring it under the bound.
    (f"shapes: [{{gpuCount: 1, perGPU: {INT64_MAX + 1}}}]", "Shape 0 .*perGPU and cpuMilli at most"),
])
def test_bad_seed_files_are_refused_with_a_reason(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "seed.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_workload(path)


def test_a_missing_seed_file_says_which(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"Cannot read the workload seed .*missing\.yaml"):
        load_workload(tmp_path / "missing.yaml")


def test_invalid_settings_and_empty_seeds_are_refused() -> None:
    with pytest.raises(ValueError, match="half_life and refresh_every must be positive"):
        WorkloadDistribution(coverage=1.5)
    with pytest.raises(ValueError, match="at least one shape with a positive, finite weight"):
        WorkloadDistribution().seed({SMALL: 0.0})
