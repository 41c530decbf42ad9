"""Placement policies on small hand-made nodes: what each one prefers, and what none may do."""

from __future__ import annotations

import bisect
import math
from dataclasses import replace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpushare.contract import ModelRule, PodRequest
from gpushare.model import GPU, Node
from gpushare.policies import DEFAULT_POLICY, choose_node, extender_scores, make_policy, node_priority, policy_names
from gpushare.policies.base import classes_shares, follows_cluster, follows_inventory
from gpushare.policies.fgd import (
    CHOICES_LIMIT,
    DEMANDS_LIMIT,
    GPU_SIDE_NUMBERS_LIMIT,
    PRECISION,
    Demand,
    DemandSides,
    FragmentationGradient,
    FragmentationMeasure,
    Pool,
    SharedSides,
    rank_left,
    rank_right,
)
from gpushare.policies.lookahead import FragmentationLookahead
from gpushare.policies.simple import Binpack, Spread
from gpushare.policies.workload import Shape, WorkloadDistribution, share_class


def node(name: str, *frees: int, total: int = 1000, model: str = "T4", cpu: int = 0, cpu_used: int = 0,
         memory: int = 0) -> Node:
    gpus = [GPU(index=i, model=model, total=total, used=total - free, holders=int(free < total))
            for i, free in enumerate(frees)]
    return Node(name=name, gpus=gpus, cpu_milli=cpu, cpu_used=cpu_used, memory_mib=memory)


def workload(*shapes: tuple[Shape, float]) -> WorkloadDistribution:
    distribution = WorkloadDistribution()
    distribution.seed(dict(shapes))
    return distribution


def share(units: int, cpu: int = 0, count: int = 1, models: ModelRule | None = None) -> PodRequest:
    return PodRequest(per_gpu=units, gpu_count=count, cpu_milli=cpu, models=models or ModelRule())


ALL = [Binpack(), Spread(), FragmentationGradient(workload((Shape(1, 500), 1.0))),
       FragmentationLookahead(workload((Shape(1, 500), 1.0)))]


def test_binpack_takes_the_tightest_gpu_and_node() -> None:
    nodes = [node("a", 1000, 700), node("b", 400, 1000)]
    chosen = choose_node(nodes, share(300), Binpack())
    assert chosen is not None
    assert (chosen[0].name, chosen[1].gpus) == ("b", (0,))
    candidate = Binpack().evaluate(nodes[0], share(300))
    assert candidate is not None and candidate.gpus == (1,)


def test_spread_takes_the_emptiest_gpu_and_node() -> None:
    nodes = [node("a", 1000, 700), node("b", 400, 1000, 1000, 1000)]
    chosen = choose_node(nodes, share(300), Spread())
    assert chosen is not None
    assert (chosen[0].name, chosen[1].gpus) == ("b", (1,))


def test_fgd_avoids_the_sliver_binpack_leaves() -> None:
    # The expected tasks take 500 units. Binpack puts a 300-unit pod on the 600-unit GPU and strands the
    # 300 left over; FGD puts it on the whole GPU, where 700 stay usable.
    fgd = FragmentationGradient(workload((Shape(1, 500), 1.0)))
    nodes = [node("tight", 600), node("whole", 1000)]
    packed = choose_node(nodes, share(300), Binpack())
    assert packed is not None and packed[0].name == "tight"
    chosen = choose_node(nodes, share(300), fgd)
    assert chosen is not None and chosen[0].name == "whole"
    on_one_node = fgd.evaluate(node("both", 600, 1000), share(300))
    assert on_one_node is not None and on_one_node.gpus == (1,)
    assert fgd.fragmentation(node("x", 600, 300)) == 300


def test_fgd_counts_a_node_that_cannot_run_a_task_as_all_fragment() -> None:
    fgd = FragmentationGradient(workload((Shape(2, 1000, cpu_milli=8000), 1.0)))
    assert fgd.fragmentation(node("one-free", 1000, 500, cpu=32000)) == 1500
    assert fgd.fragmentation(node("no-cpu", 1000, 1000, cpu=32000, cpu_used=30000)) == 2000
    assert fgd.fragmentation(node("fits", 1000, 1000, 300, cpu=32000)) == 300
    v100 = FragmentationGradient(workload((Shape(1, 100, models=ModelRule(("v100m32",))), 1.0)))
    assert v100.fragmentation(node("t4", 1000)) == 1000
    assert v100.fragmentation(node("v100", 1000, model="V100M32")) == 0


def test_lookahead_keeps_cores_where_gpus_need_them() -> None:
    # Four idle GPUs and cores for exactly four 10-core one-GPU tasks, against a CPU-rich node: a CPU-only
    # pod changes nothing for FGD (a task still fits either way) but costs the dense node a GPU's worth.
    expected = ((Shape(1, 1000, cpu_milli=10000), 1.0),)
    dense = node("dense", 1000, 1000, 1000, 1000, cpu=40000)
    rich = node("rich", 1000, 1000, cpu=100000)
    cpu_only = PodRequest(per_gpu=0, gpu_count=0, cpu_milli=10000)
    fgd, lookahead = FragmentationGradient(workload(*expected)), FragmentationLookahead(workload(*expected))
    fgd_dense, fgd_rich = fgd.evaluate(dense, cpu_only), fgd.evaluate(rich, cpu_only)
    assert fgd_dense is not None and fgd_rich is not None and fgd_dense.score == fgd_rich.score == 50
    ahead = choose_node([dense, rich], cpu_only, lookahead)
    assert ahead is not None and ahead[0].name == "rich" and ahead[1].gpus == ()
    ahead_dense = lookahead.evaluate(dense, cpu_only)
    assert ahead_dense is not None and ahead_dense.score == -1000


def test_fgd_counts_all_idle_memory_as_fragment_for_a_task_without_gpus() -> None:
    # The paper's rule: a CPU-only task can use no idle GPU memory, whether or not its cores are there.
    fgd = FragmentationGradient(workload((Shape(0, 0, cpu_milli=8000), 0.5), (Shape(1, 500), 0.5)))
    assert fgd.fragmentation(node("cores", 1000, 300, cpu=32000)) == 0.5 * 1300 + 0.5 * 300
    assert fgd.fragmentation(node("no-cores", 1000, 300, cpu=32000, cpu_used=30000)) == 0.5 * 1300 + 0.5 * 300


@pytest.mark.parametrize("total", [1000, 16])
def test_fgd_scores_growth_in_gpus_as_the_paper_does(total: int) -> None:
    # int(100 * sigmoid(-growth)), growth in GPUs: stranding 0.3 of a GPU scores 42, growing nothing 50,
    # whether a GPU is 1000 units (the trace) or 16 (GiB).
    fgd = FragmentationGradient(workload((Shape(1, total // 2), 1.0)))
    pod = share(total * 3 // 10)
    whole, tight = fgd.evaluate(node("whole", total, total=total), pod), fgd.evaluate(
        node("tight", total * 6 // 10, total=total), pod)
    assert whole is not None and tight is not None
    assert whole.score == 50 and tight.score == int(100 / (1 + math.exp((total * 6 // 10 - total * 3 // 10) / total)))
    assert tight.score == 42


def test_fgd_takes_the_first_gpu_among_equal_scores() -> None:
    # Stranding 320 or 300 units both score 42 on the paper's scale, so the lower index wins although GPU 1
    # strands less.
    fgd = FragmentationGradient(workload((Shape(1, 500), 1.0)))
    candidate = fgd.evaluate(node("n", 620, 600), share(300))
    assert candidate is not None and candidate.gpus == (0,) and candidate.score == 42


def test_lookahead_breaks_ties_of_gpu_shares_with_the_fgd_score() -> None:
    # Placing 300 units strands nothing the 500-unit tasks need on either node, but on the V100 it leaves
    # less than the rare 980-unit V100 task needs: 42 units of growth, within the lookahead's step of 98
    # (a tie there), 48 against 50 on FGD's scale. The tie goes to the T4 even where node priority
    # prefers the V100.
    expected = ((Shape(1, 500), 0.94), (Shape(1, 980, models=ModelRule(("v100m32",))), 0.06))
    lookahead = FragmentationLookahead(workload(*expected))
    t4, v100 = node("t4", 1000), node("v100", 1000, model="V100M32")
    on_t4, on_v100 = lookahead.evaluate(t4, share(300)), lookahead.evaluate(v100, share(300))
    assert on_t4 is not None and on_v100 is not None
    assert 98 / 2 > on_t4.score > on_v100.score > 0
    seed = next(s for s in range(100) if node_priority("v100", s) > node_priority("t4", s))
    chosen = choose_node([v100, t4], share(300), lookahead, seed=seed)
    assert chosen is not None and chosen[0].name == "t4"


@pytest.mark.parametrize("policy", ALL, ids=lambda p: p.name)
def test_no_policy_places_a_pod_on_a_model_it_excludes(policy: Binpack) -> None:
    request = share(300, models=ModelRule(("v100m32",)))
    assert policy.evaluate(node("t4", 1000, 1000), request) is None
    chosen = choose_node([node("t4", 1000, 1000), node("v100", 900, model="V100M32")], request, policy)
    assert chosen is not None and chosen[0].name == "v100"


@pytest.mark.parametrize("policy", ALL, ids=lambda p: p.name)
def test_multi_gpu_pods_need_whole_free_gpus(policy: Binpack) -> None:
    request = share(1000, count=2)
    assert policy.evaluate(node("busy", 1000, 999, 999), request) is None
    candidate = policy.evaluate(node("free", 999, 1000, 1000), request)
    assert candidate is not None and sorted(candidate.gpus) == [1, 2]


@pytest.mark.parametrize("policy", ALL, ids=lambda p: p.name)
def test_cpu_and_memory_are_hard_limits(policy: Binpack) -> None:
    full = node("full", 1000, cpu=8000, cpu_used=6000, memory=1024)
    assert policy.evaluate(full, share(100, cpu=4000)) is None
    assert policy.evaluate(full, PodRequest(per_gpu=100, memory_mib=2048)) is None
    assert policy.evaluate(full, PodRequest(per_gpu=0, gpu_count=0, cpu_milli=2000)) is not None


def test_exclusive_pods_get_untouched_gpus_from_fgd() -> None:
    fgd = FragmentationGradient(workload((Shape(1, 500), 1.0)))
    request = PodRequest(per_gpu=100, exclusive=True)
    assert fgd.evaluate(node("used", 999, 999), request) is None
    candidate = fgd.evaluate(node("mixed", 999, 1000), request)
    assert candidate is not None and candidate.gpus == (1,)


def test_fgd_prefers_nvlinked_gpus_for_multi_gpu_pods() -> None:
    gpus = [GPU(index=i, model="A100", total=1000, numa=0) for i in range(4)]
    gpus[1].links = {3: 100}
    gpus[3].links = {1: 100}
    fgd = FragmentationGradient(workload((Shape(2, 1000), 1.0)))
    candidate = fgd.evaluate(Node(name="n", gpus=gpus), share(1000, count=2))
    assert candidate is not None and sorted(candidate.gpus) == [1, 3]


@pytest.mark.parametrize("kind", [FragmentationGradient, FragmentationLookahead])
def test_memoised_gpu_choices_follow_every_change_of_the_gpus(kind: type[FragmentationGradient]) -> None:
    # One policy keeps its GPU choices per GPU state across calls; a fresh one per call computes them anew.
    # Both must agree while the node fills up, on its NVLinked twin and on an unhealthy GPU.
    shapes = ((Shape(1, 500), 0.6), (Shape(2, 1000), 0.4))
    kept = kind(workload(*shapes))
    plain = node("plain", 1000, 1000, 1000, 1000, cpu=64_000)
    linked = node("linked", 1000, 1000, 1000, 1000, cpu=64_000)
    linked.gpus[2].links, linked.gpus[3].links = {3: 100}, {2: 100}
    requests = [share(1000, cpu=1000, count=2), share(300, cpu=2000), share(500), share(300, cpu=2000)]
    seen = set()
    for step, request in enumerate(requests):
        for n in (plain, linked):
            candidate = kept.evaluate(n, request)
            assert candidate == kind(workload(*shapes)).evaluate(n, request)
            assert candidate is not None
            seen.add((n.name, candidate.gpus))
            n.place(f"pod-{step}", request, candidate.gpus)
    plain.gpus[3].healthy = False
    assert kept.evaluate(plain, share(100)) == kind(workload(*shapes)).evaluate(plain, share(100))
    # One pod on each GPU: the same holders, different memory used.
    assert kept.evaluate(node("roomy", 700), share(500)) is not None
    assert kept.evaluate(node("tight", 400), share(500)) is None
    assert ("plain", (0, 1)) in seen and ("linked", (2, 3)) in seen


def test_a_fresh_fgd_learns_the_workload_from_what_it_observes() -> None:
    fgd = FragmentationGradient()
    assert not fgd.workload.target
    fgd.observe(share(500))
    assert fgd.workload.target == ((Shape(1, 500), 1.0),)
    assert fgd.fragmentation(node("x", 400, 1000)) == 400


def test_scores_map_onto_the_extender_scale_with_one_favourite() -> None:
    fgd = FragmentationGradient(workload((Shape(1, 500), 1.0)))
    nodes = [node("tight", 600), node("whole", 1000), node("twin", 1000)]
    scores = {}
    for n in nodes:
        candidate = fgd.evaluate(n, share(300))
        assert candidate is not None
        scores[n.name] = candidate.score
    mapped = {name: score for score, names in extender_scores(scores).items() for name in names}
    assert mapped["tight"] == 0 and sorted(mapped.values()) == [0, 9, 10]
    chosen = choose_node(nodes, share(300), fgd)
    assert chosen is not None and mapped[chosen[0].name] == 10


def test_registry_builds_every_policy_and_rejects_unknown_names() -> None:
    assert {"binpack", "spread", "fgd", "fgd-lookahead"} <= set(policy_names())
    assert DEFAULT_POLICY in policy_names()
    distribution = workload((Shape(1, 500), 1.0))
    for name in policy_names():
        policy = make_policy(name, distribution)
        assert policy.name == name
    learning = make_policy("fgd", distribution)
    assert isinstance(learning, FragmentationGradient) and learning.workload is distribution
    with pytest.raises(ValueError, match="Unknown placement policy 'best'; choose one of"):
        make_policy("best")


def test_binpack_counts_an_exclusive_pod_as_filling_its_gpu() -> None:
    node = Node(name="n", gpus=[GPU(index=0, model="T4", total=16), GPU(index=1, model="T4", total=16, used=4,
                                                                        holders=1)])
    candidate = Binpack().evaluate(node, PodRequest(per_gpu=2, exclusive=True))
    assert candidate is not None and candidate.gpus == (0,) and candidate.score == 1.0


@settings(max_examples=200, deadline=None)
@given(frees=st.lists(st.integers(0, 1000), min_size=1, max_size=8), cpu_used=st.integers(0, 32000),
       memory_used=st.integers(0, 65536), units=st.integers(1, 1000), count=st.integers(1, 3),
       cpu=st.integers(0, 32000), memory=st.integers(1, 65536), name=st.sampled_from(policy_names()))
def test_where_a_pod_fits_its_memory_request_changes_no_score(frees: list[int], cpu_used: int, memory_used: int,
                                                               units: int, count: int, cpu: int, memory: int,
                                                               name: str) -> None:
    """Filter shares scores between pods that differ only in memory (``Policy.evaluate``): a policy may read the
    memory request only to tell whether the pod fits."""
    host = node("n", *frees, cpu=32000, cpu_used=min(cpu_used, 32000), memory=65536)
    host.memory_used = memory_used
    learned = workload((Shape(1, 500, 4000), 3.0), (Shape(2, 1000, 16000), 1.0), (Shape(8, 1000, 30000), 0.1))
    policy = make_policy(name, learned)
    if follows_inventory(policy):
        policy.observe_inventory({"T4": 1000 * len(frees)})
    if follows_cluster(policy):
        policy.observe_nodes([host, node("spare", 1000, 1000, cpu=32000, memory=65536)])
    request = PodRequest(per_gpu=units, gpu_count=count, cpu_milli=cpu, memory_mib=memory)
    if not host.fits(request):
        return
    assert policy.evaluate(host, request) == policy.evaluate(host, replace(request, memory_mib=0))


@settings(max_examples=300, deadline=None)
@given(gpus=st.lists(st.tuples(st.sampled_from(["T4", "G2"]), st.integers(0, 1000)), min_size=1, max_size=8),
       cores=st.sampled_from([0, 16000, 32000, 96000]), cpu_used=st.one_of(st.just(0), st.integers(0, 96000)),
       units=st.sampled_from([100, 250, 333, 500, 1000]), count=st.integers(1, 3), exclusive=st.booleans(),
       step=st.sampled_from([250, 1000, 1999]), name=st.sampled_from(policy_names()))
def test_a_pod_that_asks_for_more_cpu_never_scores_higher(gpus: list[tuple[str, int]], cores: int, cpu_used: int,
                                                          units: int, count: int, exclusive: bool, step: int,
                                                          name: str) -> None:
    """The cache answers a pod from the scores of pods that differ from it only in CPU (``Policy.evaluate``): a
    policy's score must never rise with the CPU asked, with the target's CPU thresholds, the lookahead's copies fed
    and fgd-scarcity's balance of cores all in play. Every ``step`` millicores up to all the node has free."""
    host = Node("n", [GPU(i, model, 1000, used=1000 - free, holders=int(free < 1000))
                      for i, (model, free) in enumerate(gpus)], cpu_milli=cores, cpu_used=min(cpu_used, cores))
    learned = workload((Shape(1, 500, 4000), 3.0), (Shape(1, 250, 1000), 2.0), (Shape(2, 1000, 16000), 1.0),
                       (Shape(1, 1000, 30000, models=ModelRule(("G2",))), 0.5), (Shape(0, 0, 8000), 1.0))
    policy = make_policy(name, learned)
    if follows_inventory(policy):
        policy.observe_inventory({"T4": 8000, "G2": 4000})
    if follows_cluster(policy):
        policy.observe_nodes([host, Node("spare", [GPU(0, "G2", 1000), GPU(1, "G2", 1000)], cpu_milli=8000)])
    scores = []
    for cpu in range(0, (cores - host.cpu_used if cores else 64000) + step, step):
        request = PodRequest(per_gpu=units, gpu_count=count, exclusive=exclusive, cpu_milli=cpu)
        candidate = policy.evaluate(host, request)
        if candidate is not None:
            scores.append(candidate.score)
    assert scores == sorted(scores, reverse=True)


@settings(max_examples=300, deadline=None)
@given(gpus=st.lists(st.tuples(st.sampled_from(["T4", "G2"]), st.sampled_from([1000, 1100, 16384]),
                               st.floats(0.0, 1.0)), min_size=1, max_size=8),
       cores=st.sampled_from([0, 16000, 96000]), cpu_used=st.integers(0, 96000), cpu=st.integers(0, 16000),
       low=st.one_of(st.integers(50, 1100), st.integers(1100, 16384)), name=st.sampled_from(policy_names()))
@example(gpus=[("T4", 1100, 1.0), ("T4", 1000, 1.0)], cores=0, cpu_used=0, cpu=0, low=1000,
         name="fgd-lookahead")  # 1,100 units is the largest GPU's size: no tie-break by FGD's own score there
@example(gpus=[("T4", 16384, 1.0), ("T4", 16384, 0.7890625)], cores=0, cpu_used=0, cpu=0, low=12000,
         name="fgd")  # with growth worked out for each exact share, a larger share of this class scores higher
def test_a_one_gpu_share_of_the_same_class_that_is_larger_never_scores_higher(
        gpus: list[tuple[str, int, float]], cores: int, cpu_used: int, cpu: int, low: int, name: str) -> None:
    """A policy that weighs a one-GPU share by its class (``ClassedShares``) never scores a node higher for a larger
    share of the same class: the cache answers a pod from the scores of pods whose shares of its class are below and
    above its own (``Bracket``). Shares across ``low``'s class, on GPUs of mixed sizes."""
    host = Node("n", [GPU(i, model, total, used=total - int(total * free), holders=int(free < 1.0))
                      for i, (model, total, free) in enumerate(gpus)], cpu_milli=cores, cpu_used=min(cpu_used, cores))
    learned = workload((Shape(1, 500, 4000), 3.0), (Shape(1, 250, 1000), 2.0), (Shape(2, 1000, 16000), 1.0),
                       (Shape(1, 1000, 30000, models=ModelRule(("G2",))), 0.5), (Shape(0, 0, 8000), 1.0),
                       (Shape(1, 8000, 4000), 1.0), (Shape(1, 12000, 8000), 1.0))
    policy = make_policy(name, learned)
    if not classes_shares(policy):
        assert name in ("binpack", "spread")  # their score rises as the chosen GPU fills
        return
    if follows_inventory(policy):
        policy.observe_inventory({"T4": 8000, "G2": 4000})
    if follows_cluster(policy):
        policy.observe_nodes([host, Node("spare", [GPU(0, "G2", 1000), GPU(1, "G2", 1000)], cpu_milli=8000)])
    start = policy.share_class(low)
    width = 10 ** max(len(str(start)) - 2, 0)  # the class spans this many units
    scores = []
    for units in range(start, start + width, max(width // 25, 1)):
        assert policy.share_class(units) == start
        candidate = policy.evaluate(host, share(units, cpu))
        scores.append(-math.inf if candidate is None else candidate.score)
    assert scores == sorted(scores, reverse=True)


def test_only_the_fgd_family_weighs_a_share_by_its_class() -> None:
    """binpack and spread score a larger share higher where its GPU fills more: their answers are found from other
    CPU requests only."""
    assert [n for n in policy_names() if classes_shares(make_policy(n))] == ["fgd", "fgd-lookahead", "fgd-scarcity"]
    assert make_policy("fgd").share_class(4095) == share_class(4095) == 4000


@pytest.mark.parametrize("name", ["fgd", "fgd-lookahead", "fgd-scarcity"])
def test_fgd_weighs_a_share_by_its_class_on_the_gpus_its_exact_share_fits(name: str) -> None:
    """Shares of one class (two significant digits, as the target keeps them) meet the same states after each
    placement, so that F remembered for one serves the others; the GPUs compared are still those the exact share
    fits, and where the same GPUs fit, the answers are the same, remembered once."""
    host = node("n", 1000, 575, 300)
    policy = make_policy(name, workload((Shape(1, 570), 1.0), (Shape(1, 250), 1.0)))
    if follows_inventory(policy):
        policy.observe_inventory({"T4": 3000})
    if follows_cluster(policy):
        policy.observe_nodes([host])
    assert isinstance(policy, FragmentationGradient)
    low, high, beyond = (policy.gpu_choices(host, share(units)) for units in (571, 574, 578))
    assert low is not None and high is not None and beyond is not None
    assert [(gpus, pools) for gpus, _, pools, _ in low.options] == [(gpus, pools) for gpus, _, pools, _ in high.options]
    assert [gpus for gpus, _, _, _ in low.options] == [(0,), (1,)]
    assert [gpus for gpus, _, _, _ in beyond.options] == [(0,)]
    assert low is high and beyond is not low  # the GPU with 575 free lies between 574 and 578
    assert policy.evaluate(host, share(571)) == policy.evaluate(host, share(574))
    placed = policy.evaluate(host, share(578))
    assert placed is not None and placed.gpus == (0,)


def _fragment_by_definition(node: Node, target: list[tuple[Shape, float]], lookahead: bool) -> float:
    """F as the module docstrings define it, shape by shape and GPU by GPU: the idle memory a task of each shape
    could not use (FGD: one more task; the lookahead: as many as the GPUs and the free CPU allow), weighted."""
    cpu_free = node.cpu_milli - node.cpu_used
    idle = sum(g.free for g in node.gpus)
    total = 0.0
    for shape, probability in target:
        if shape.cpu_milli > cpu_free:  # not one pod of the shape fits: all idle memory is fragment for it
            total += probability * idle
            continue
        if shape.gpu_count == 0:  # FGD: a pod without GPUs uses none; the lookahead: none is lost while it fits
            total += probability * (0 if lookahead else idle)
            continue
        hosts = [g for g in node.gpus if shape.models.accepts(g.model) and (
            g.free == g.total and g.used == 0 and g.holders == 0 if shape.exclusive else g.free >= shape.per_gpu)]
        usable = sum(g.free for g in hosts)
        if not lookahead:
            total += probability * (idle if len(hosts) < shape.gpu_count else idle - usable)
            continue
        if shape.gpu_count == 1 and not shape.exclusive and shape.per_gpu > 0:
            copies = sum(g.free // shape.per_gpu for g in hosts)
            per_copy = shape.per_gpu
        else:
            copies = len(hosts) // shape.gpu_count
            per_copy = (shape.per_gpu if not shape.exclusive and shape.per_gpu > 0 else
                        usable // len(hosts) if hosts else 0) * shape.gpu_count
        placed = min(copies, cpu_free // shape.cpu_milli) if shape.cpu_milli else copies
        used = usable if placed >= copies else min(usable, placed * per_copy)
        total += probability * (idle - used if copies > 0 else idle)
    return total


_MODELS = ["T4", "V100M16", "G2"]
_NODE_CPU = 64000
_SHAPE_CPUS = [0, 2000, 4000, 8000, 32000]
# A node's CPU used, drawn where the CPU left meets a shape's CPU (each one millicore either side) as often as
# anywhere in the range: drawn from the range alone, 8 draws in 300 left some shape without the CPU it asks (74 now).
_CPU_USED = st.one_of(st.integers(0, _NODE_CPU),
                      st.sampled_from(sorted({_NODE_CPU - cpu + step for cpu in _SHAPE_CPUS if cpu
                                              for step in (-1, 0, 1)})))


@settings(max_examples=300, deadline=None)
@given(gpus=st.lists(st.tuples(st.sampled_from(_MODELS), st.integers(0, 1000), st.booleans()), min_size=1, max_size=8),
       cpu_used=_CPU_USED,
       shapes=st.lists(st.tuples(st.integers(0, 8), st.sampled_from([0, 100, 250, 500, 1000]),
                                 st.sampled_from(_SHAPE_CPUS), st.booleans(),
                                 st.sampled_from([(), ("T4",), ("G2", "V100M16")]), st.integers(1, 20)),
                       min_size=1, max_size=30))
def test_both_measures_give_what_their_definition_gives(
        gpus: list[tuple[str, int, bool]], cpu_used: int,
        shapes: list[tuple[int, int, int, bool, tuple[str, ...], int]]) -> None:
    """FGD's and the lookahead's F, summed per GPU demand and by CPU for speed, equal the definition's sum over
    every shape and GPU (exactly, in the integer units they compare)."""
    host = Node("n", [GPU(index=i, model=model, total=1000, used=1000 - free if touched or free < 1000 else 0,
                          holders=int(touched or free < 1000))
                      for i, (model, free, touched) in enumerate(gpus)], cpu_milli=_NODE_CPU, cpu_used=cpu_used)
    learned = workload(*((Shape(count, per_gpu if count else 0, cpu, exclusive and count > 0, ModelRule(models)),
                          float(weight)) for count, per_gpu, cpu, exclusive, models, weight in shapes))
    target = list(learned.target)
    # The measures weigh each shape in parts per million: each rounding moves F by at most half a part of the idle.
    rounding = len(target) * sum(g.free for g in host.gpus) / 2 / PRECISION
    for policy, ahead in ((FragmentationGradient(learned), False), (FragmentationLookahead(learned), True)):
        expected = _fragment_by_definition(host, target, ahead)
        assert abs(policy.fragmentation(host) - expected) <= rounding + 1e-9, policy.name


@settings(max_examples=100, deadline=None)
@given(gpus=st.lists(st.tuples(st.sampled_from(_MODELS), st.integers(0, 1000), st.booleans()), min_size=1, max_size=8),
       shapes=st.lists(st.tuples(st.integers(1, 8), st.sampled_from([100, 250, 500, 1000]),
                                 st.sampled_from([0, 1000, 3000, 8000]), st.booleans(),
                                 st.sampled_from([(), ("T4",), ("G2", "V100M16")]), st.integers(1, 20)),
                       min_size=1, max_size=12))
def test_the_lookahead_measure_is_exact_where_the_free_cpu_feeds_exactly_some_copies(
        gpus: list[tuple[str, int, bool]], shapes: list[tuple[int, int, int, bool, tuple[str, ...], int]]) -> None:
    """The lookahead sums F by bisecting each demand's shapes by CPU: at every free CPU that feeds a shape's copies
    exactly (and one millicore either side), F is still the definition's."""
    learned = workload(*((Shape(count, per_gpu, cpu, exclusive, ModelRule(models)), float(weight))
                         for count, per_gpu, cpu, exclusive, models, weight in shapes))
    target = list(learned.target)
    policy = FragmentationLookahead(learned)
    capacity = 64000
    edges = {copies * cpu + step for _, _, cpu, _, _, _ in shapes for copies in range(82) for step in (-1, 0, 1)}
    for cpu_free in sorted(e for e in edges if 0 <= e <= capacity):
        host = Node("n", [GPU(index=i, model=model, total=1000, used=1000 - free if touched or free < 1000 else 0,
                              holders=int(touched or free < 1000))
                          for i, (model, free, touched) in enumerate(gpus)],
                    cpu_milli=capacity, cpu_used=capacity - cpu_free)
        rounding = len(target) * sum(g.free for g in host.gpus) / 2 / PRECISION
        expected = _fragment_by_definition(host, target, True)
        assert abs(policy.fragmentation(host) - expected) <= rounding + 1e-9, cpu_free


_SHAPES = st.lists(st.tuples(st.integers(0, 4), st.sampled_from([100, 250, 500, 1000]), st.sampled_from([0, 4000]),
                             st.booleans(), st.sampled_from([(), ("T4",), ("G2", "V100M16")]), st.integers(1, 20)),
                   min_size=1, max_size=10)


def _learned(*targets: list[tuple[int, int, int, bool, tuple[str, ...], int]]) -> WorkloadDistribution:
    """A workload seeded with each target in turn, the last one heaviest."""
    distribution = WorkloadDistribution()
    for heft, shapes in enumerate(targets):
        distribution.seed({Shape(count, per_gpu if count else 0, cpu, exclusive and count > 0, ModelRule(models)):
                           float(weight) for count, per_gpu, cpu, exclusive, models, weight in shapes},
                          observations=10.0 ** (3 * heft))
    return distribution


@settings(max_examples=150, deadline=None)
@given(hosts=st.lists(st.lists(st.tuples(st.sampled_from(_MODELS), st.integers(0, 1000), st.booleans()), min_size=1,
                               max_size=4), min_size=1, max_size=6),
       before=_SHAPES, after=_SHAPES)
def test_a_measure_reading_the_gpu_sides_of_earlier_targets_gives_what_a_fresh_one_gives(
        hosts: list[list[tuple[str, int, bool]]], before: list[tuple[int, int, int, bool, tuple[str, ...], int]],
        after: list[tuple[int, int, int, bool, tuple[str, ...], int]]) -> None:
    """A measure built when the policy learns reads the GPU sides (what each demand could use of a set of pools)
    worked out for the targets before it, extending them for the demands they lacked: F is what a policy that only
    ever knew the new target gives, on GPUs met under the old target and on GPUs new to both."""
    nodes = [Node(f"n{i}", [GPU(index=j, model=model, total=1000, used=1000 - free if touched or free < 1000 else 0,
                                holders=int(touched or free < 1000)) for j, (model, free, touched) in enumerate(gpus)],
                  cpu_milli=8000)
             for i, gpus in enumerate(hosts)]
    for kind in (FragmentationGradient, FragmentationLookahead):
        learning = kind(_learned(before))
        for host in nodes[::2]:  # the others are new to the GPU sides the next target reads
            learning.fragmentation(host)
        learning.workload.seed(_learned(after).histogram(), observations=1e6)
        fresh = kind(_learned(before))
        fresh.workload.seed(_learned(after).histogram(), observations=1e6)
        assert learning.workload.target == fresh.workload.target
        for host in nodes:
            assert learning.fragmentation(host) == fresh.fragmentation(host), kind.name


def _held_once(sides: DemandSides) -> bool:
    """Whether the numbers the sides hold (those above CPython's cache of small ints) repeat, each value as one
    object."""
    numbers = [n for _, (_, hosted) in sides._sides.values() for n in hosted if n > 256]
    return len({id(n) for n in numbers}) == len(set(numbers)) < len(numbers)


def test_the_gpu_sides_of_many_demands_are_held_within_a_bound_on_their_numbers_and_stay_right() -> None:
    """With a thousand distinct GPU shares (memory asked in MiB, each pod its own amount) each set of pools lists
    thousands of numbers, so a store bounded by its entries alone held hundreds of MB: the numbers are bounded too,
    and a side worked out after the store was emptied is the one a fresh store works out."""
    demands = [(1, share, False, ModelRule()) for share in range(1, 1001)]
    sides = DemandSides(demands)
    pools_seen: list[tuple[Pool, ...]] = []
    for i in range(1600):  # each side lists four numbers per share: past the bound after 750 sets of pools
        frees = tuple(sorted((i * 7 + j * 131) % 1000 + 1000 for j in range(8)))
        pools: tuple[Pool, ...] = (("T4", frees, ()),)
        pools_seen.append(pools)
        sides.side(pools, len(demands))
        assert sum(len(hosted) for _, (_, hosted) in sides._sides.values()) <= GPU_SIDE_NUMBERS_LIMIT
    assert len(sides._sides) < 1600
    # The side that found the store full keeps its numbers in the emptied store's table of values: those worked out
    # after it share them.
    assert _held_once(sides)
    for pools in pools_seen[::97]:  # some were forgotten and worked out again, some never were
        assert sides.side(pools, len(demands)) == DemandSides(demands).side(pools, len(demands))


@given(keys=st.lists(st.integers(-3, 40), max_size=12), value=st.integers(-5, 45))
def test_the_compiled_bisections_find_what_bisect_finds(keys: list[int], value: int) -> None:
    ordered = tuple(sorted(keys))
    assert rank_left(ordered, value) == bisect.bisect_left(ordered, value)
    assert rank_right(ordered, value) == bisect.bisect_right(ordered, value)


def _pools_of(gpus: list[tuple[str, int, bool]]) -> tuple[Pool, ...]:
    """Pools as the policies build them, from (model, free units of 1,000, untouched) per GPU."""
    return tuple((model, tuple(sorted(free for m, free, _ in gpus if m == model)),
                  tuple(sorted(free for m, free, whole in gpus if m == model and whole)))
                 for model in sorted({m for m, _, _ in gpus}))


def _by_demand(sides: DemandSides, hosted: tuple[int, ...]) -> list[tuple[Demand, int, int, int]]:
    """A side's entries with their demand instead of its number."""
    return sorted(((sides._demands[hosted[i]], hosted[i + 1], hosted[i + 2], hosted[i + 3])
                   for i in range(0, len(hosted), 4)), key=repr)


# Free memory and shares: often the demands' own shares and their sums, so that what is left lands on a share.
_UNITS = st.one_of(st.sampled_from([0, 50, 100, 250, 500, 750, 990, 1000]), st.integers(0, 1000))
_DEMANDS = st.lists(st.tuples(st.integers(0, 4), st.sampled_from([0, 50, 100, 250, 500, 990, 1000]), st.booleans(),
                              st.sampled_from([ModelRule(), ModelRule(("T4",)), ModelRule(("G2", "V100M16"))])),
                    min_size=1, max_size=24, unique=True)


@settings(max_examples=200, deadline=None)
# A share that fits the GPU exactly, and no more once memory is taken from it.
@example(gpus=[("T4", 500), ("T4", 1000)], demands=[(1, 500, False, ModelRule())], later=[], taken=100,
         remembered=True)
@given(gpus=st.lists(st.tuples(st.sampled_from(_MODELS), _UNITS), min_size=1, max_size=8),
       demands=_DEMANDS, later=_DEMANDS, taken=_UNITS, remembered=st.booleans())
def test_a_gpu_side_read_after_its_placement_was_weighed_is_the_side_worked_out_afresh(
        gpus: list[tuple[str, int]], demands: list[Demand], later: list[Demand], taken: int, remembered: bool) -> None:
    """A placement's pools after, weighed from its pools before and a one-GPU share taken (F summed over the side
    before, nothing stored for the pools after), then read for themselves (a pod bound there): their side is the one a
    fresh store works out, for the demands numbered since too. Taken from each GPU in turn, as drawn and so as to leave
    exactly each demand's share; with the side before still in the store or not (``remembered``)."""
    rows = [(model, free, free == 1000) for model, free in gpus]
    later = [demand for demand in later if demand not in demands]
    everything = [*demands, *later]
    target = tuple((Shape(count, per_gpu, 0, exclusive, models), 1 / len(demands))
                   for count, per_gpu, exclusive, models in demands)
    for index, (model, free, whole) in enumerate(rows):
        for amount in {min(taken, free), *(free - per_gpu for _, per_gpu, _, _ in everything if per_gpu <= free)}:
            before = _pools_of(rows)
            after = _pools_of([(m, f - amount, False) if i == index else (m, f, w) for i, (m, f, w) in enumerate(rows)])
            shared = SharedSides()
            measure = FragmentationMeasure(target, shared)
            sides = shared._sides
            measure.of(measure.state(0, after), (before, (model, free, amount, whole)))  # weighed, as a filter does
            if not remembered:
                sides._sides.pop(before, None)
            assert sides.number(later) is not None
            fresh_sides = DemandSides(everything)
            side, fresh = sides.side(after, len(everything)), fresh_sides.side(after, len(everything))
            # Numbered differently (a measure numbers the demands that need GPUs): compared demand by demand.
            assert side[0] == fresh[0] and _by_demand(sides, side[1]) == _by_demand(fresh_sides, fresh[1])


_WEIGHTED_SHAPES = st.lists(st.tuples(st.builds(Shape, st.integers(0, 3),
                                                st.sampled_from([0, 50, 100, 250, 500, 990, 1000]),
                                                st.sampled_from([0, 1000, 4000, 16000]), st.booleans(),
                                                st.sampled_from([ModelRule(), ModelRule(("T4",))])),
                                      st.integers(1, 9)),
                            min_size=1, max_size=16)


@settings(max_examples=150, deadline=None)
# A two-GPU share on GPUs with exactly its share free (one of them then no longer counts); CPU that feeds every copy
# of a share after the share is taken (three copies), not before (four).
@example(gpus=[("T4", 500), ("T4", 500), ("T4", 1000)], shapes=[(Shape(2, 500), 1), (Shape(1, 100, 4000), 2)],
         taken=100, cpu_free=16000, cpu_taken=1000, paired=True)
@example(gpus=[("T4", 1000)], shapes=[(Shape(1, 250, 4000), 1)], taken=250, cpu_free=15000, cpu_taken=0, paired=True)
@given(gpus=st.lists(st.tuples(st.sampled_from(_MODELS), _UNITS), min_size=1, max_size=8), shapes=_WEIGHTED_SHAPES,
       taken=_UNITS, cpu_free=st.integers(0, 40000), cpu_taken=st.sampled_from([0, 1000, 4000]),
       paired=st.booleans())
def test_f_after_a_share_taken_from_one_gpu_is_f_worked_out_afresh(
        gpus: list[tuple[str, int]], shapes: list[tuple[Shape, int]], taken: int, cpu_free: int, cpu_taken: int,
        paired: bool) -> None:
    """F of a placement's state after, summed over the side before as the share taken moves it (never working the
    side after out): F of the same state from a fresh store, for FGD's measure and the lookahead's, by itself and with
    the other measure worked out in the same pass (``paired``, as the lookahead's tie-break does). Taken from each GPU
    in turn, as drawn and so as to leave exactly each shape's share."""
    total = sum(weight for _, weight in shapes)
    target = [(shape, weight / total) for shape, weight in shapes]
    rows = [(model, free, free == 1000) for model, free in gpus]
    lookahead = FragmentationLookahead(workload(*target))
    fgd = FragmentationGradient(lookahead.workload, lookahead.sides)
    after_cpu = cpu_free - cpu_taken
    for index, (model, free, whole) in enumerate(rows):
        for amount in {min(taken, free), *(free - shape.per_gpu for shape, _ in shapes if shape.per_gpu <= free)}:
            before = _pools_of(rows)
            after = _pools_of([(m, f - amount, False) if i == index else (m, f, w) for i, (m, f, w) in enumerate(rows)])
            origin = (before, (model, free, amount, whole))
            first, second = (lookahead.measure(), fgd.measure()) if index % 2 else (fgd.measure(), lookahead.measure())
            first.of(first.state(cpu_free, before))  # the state before is where a filter starts: its side is stored
            states = [measure.state(after_cpu, after) for measure in (first, second)]
            companion = (second, states[1]) if paired else None
            worked_out = states[0] not in first._memo
            moved = [first.of(states[0], origin, companion)]
            if paired and worked_out:
                assert states[1] in second._memo  # worked out in the same pass, kept under its own state
            moved.append(second.of(states[1], origin))
            for kind, state, value in zip((type(first), type(second)), states, moved, strict=True):
                fresh = kind(lookahead.workload.target, SharedSides())
                assert value == fresh.of(state), kind.__name__
            assert after == before or after not in lookahead.sides._sides._sides  # never worked out and stored


def test_a_full_store_of_gpu_sides_lets_only_the_sides_read_least_recently_go() -> None:
    """A side extended by newly numbered demands just as the store is full: it is kept as the one read last, and
    only as many of the sides read least recently go as bring the numbers back within the bound (emptied whole,
    every set of pools the next filters met was worked out afresh at once). What stays is what a fresh store works
    out."""
    demands = [(1, share, False, ModelRule()) for share in range(1, 501)]
    later = [(1, share, False, ModelRule(include=("t4",))) for share in range(100, 112)]
    sides = DemandSides(demands)
    assert GPU_SIDE_NUMBERS_LIMIT % (4 * len(demands)) == 0  # so that the sides below fill the store exactly
    filled = GPU_SIDE_NUMBERS_LIMIT // (4 * len(demands))

    def pools(i: int) -> tuple[Pool, ...]:
        return (("T4", tuple(sorted((i + j * 251) % 1999 + 1000 for j in range(8))), ()),)  # distinct for i < 1999

    for i in range(filled):  # every share fits: four numbers each, to the bound
        sides.side(pools(i), len(demands))
    assert sides.number(later) is not None
    covering = len(demands) + len(later)
    extended = sides.side(pools(0), covering)  # the oldest, extended by 48 numbers: one side must go
    assert list(sides._sides) == [pools(i) for i in range(2, filled)] + [pools(0)]
    assert sum(len(hosted) for _, (_, hosted) in sides._sides.values()) <= GPU_SIDE_NUMBERS_LIMIT
    sides.side(pools(2), len(demands))  # read again: it stays
    for i in range(1600, 1610):
        sides.side(pools(i), covering)
    # Ten more sides of 2,048 numbers each, each pushing out one of 2,000 read before it.
    assert list(sides._sides)[:2] == [pools(13), pools(14)] and len(sides._sides) == filled - 1
    assert pools(2) in sides._sides
    assert _held_once(sides)
    fresh = DemandSides([*demands, *later])
    assert extended == fresh.side(pools(0), covering)
    for i in (0, 13, 1609):
        assert sides.side(pools(i), covering) == fresh.side(pools(i), covering)


def test_a_full_memo_of_gpu_choices_lets_only_its_oldest_entries_go() -> None:
    """Past its bound the memo of GPU choices loses its oldest entry for each new one, never all at once (emptied
    whole, it took 29 ms to free in the middle of a filter), and its answers stay a fresh policy's."""
    shapes = ((Shape(1, 300), 0.6), (Shape(2, 1000), 0.4))
    policy = FragmentationGradient(workload(*shapes))
    request = share(300)
    nodes = [node(f"n{i}", 1000 - i % 700, 1000 - i // 700, 1000) for i in range(CHOICES_LIMIT + 2)]  # all distinct
    for host in nodes[:CHOICES_LIMIT]:
        policy.gpu_choices(host, request)
    assert len(policy._choices) == CHOICES_LIMIT
    first, second, third = list(policy._choices)[:3]
    for host in nodes[CHOICES_LIMIT:]:
        policy.gpu_choices(host, request)
    assert len(policy._choices) == CHOICES_LIMIT
    assert first not in policy._choices and second not in policy._choices and third in policy._choices
    fresh = FragmentationGradient(workload(*shapes))
    for host in (nodes[0], nodes[2], nodes[-1]):
        assert policy.evaluate(host, request) == fresh.evaluate(host, request)


def test_the_memos_of_gpu_choices_and_gpu_sides_hold_each_distinct_row_pool_and_number_once() -> None:
    """What the memos keep is shared where it is equal: a fleet has few distinct GPU rows, pools and amounts, and kept
    per entry they took most of the 92 MiB of the GPU choices and sides at 15,000 nodes. Sharing must not change an
    answer: each node's is the one a fresh policy gives."""
    shapes = ((Shape(1, 300), 0.5), (Shape(1, 600), 0.3), (Shape(2, 1000), 0.2))
    kept = FragmentationLookahead(workload(*shapes))
    levels = (1000, 700, 400, 100)
    nodes = [node(f"n{i}", *(levels[(i >> (2 * j)) % 4] for j in range(4)), cpu=64_000) for i in range(64)]
    for host in nodes:
        for request in (share(300, cpu=1000), share(600), share(1000, count=2)):
            assert kept.evaluate(host, request) == FragmentationLookahead(workload(*shapes)).evaluate(host, request)
    rows = [row for (gpus, _, _), *_ in kept._choices for row in gpus]
    pools = [pool for choices in kept._choices.values() if choices is not None
             for pools_ in (choices.before, *(after for _, _, after, _ in choices.options)) for pool in pools_]
    assert len({id(row) for row in rows}) == len(set(rows)) < len(rows)
    assert len({id(pool) for pool in pools}) == len(set(pools)) < len(pools)
    assert _held_once(kept.sides._sides)


def test_a_node_measured_under_one_target_is_measured_again_under_the_next() -> None:
    """F is remembered per node state for one target only: a node in the same state after the policy learned a new
    target gets the new target's F (the lookahead's state key, the exact free CPU and the pools, is the same under
    both targets, so an answer kept across them would be found)."""
    host = Node("n", [GPU(index=0, model="T4", total=1000, used=300, holders=1), GPU(index=1, model="T4", total=1000)],
                cpu_milli=8000)
    before: list[tuple[int, int, int, bool, tuple[str, ...], int]] = [(1, 500, 0, False, (), 5)]
    after: list[tuple[int, int, int, bool, tuple[str, ...], int]] = [(1, 250, 4000, False, (), 4),
                                                                     (2, 1000, 0, False, (), 3)]
    for kind in (FragmentationGradient, FragmentationLookahead):
        learning = kind(_learned(before))
        assert learning.fragmentation(host) == 0  # every share of the old target fits the node's idle memory
        learning.workload.seed(_learned(after).histogram(), observations=1e6)
        fresh = kind(_learned(before))
        fresh.workload.seed(_learned(after).histogram(), observations=1e6)
        assert learning.fragmentation(host) == fresh.fragmentation(host) > 0, kind.__name__


def test_a_policy_numbers_demands_afresh_once_a_numbering_is_full_and_measures_the_same() -> None:
    """A workload that keeps bringing new GPU demands fills a numbering of them (``DEMANDS_LIMIT``); the next measure
    starts another, its GPU sides worked out again, and F is still what a policy that only knew its target gives,
    also for a target (from a seed) with more demands than a numbering takes."""
    nodes = [Node(f"n{i}", [GPU(index=j, model=model, total=1000, used=used, holders=int(used > 0))
                            for j, (model, used) in enumerate(gpus)], cpu_milli=8000)
             for i, gpus in enumerate([[("T4", 0), ("T4", 500)], [("G2", 250), ("V100M16", 0), ("G2", 0)]])]
    before = [(1, 500, 0, False, (), 5), (2, 1000, 4000, False, ("T4",), 3)]
    after = [(1, 250, 4000, False, (), 4), (1, 500, 0, False, (), 2), (4, 1000, 0, True, ("G2",), 1)]
    no_model: tuple[str, ...] = ()
    many = [(1, share, 1000, False, no_model, 1) for share in range(1, DEMANDS_LIMIT + 60)]
    for kind in (FragmentationGradient, FragmentationLookahead):
        learning = kind(_learned(before))
        for host in nodes:
            learning.fragmentation(host)
        # What a stream of odd pods would have numbered: every share of one GPU of a model nobody has.
        learning.sides.numbering([(1, share, False, ModelRule(("A100",))) for share in range(1, DEMANDS_LIMIT)])
        learned = []
        for target in (after, many):
            learned.append(_learned(target).histogram())
            learning.workload.seed(learned[-1], observations=1e9)
            fresh = kind(_learned(before))
            for histogram in learned:
                fresh.workload.seed(histogram, observations=1e9)
            assert learning.workload.target == fresh.workload.target
            for host in nodes:
                assert learning.fragmentation(host) == fresh.fragmentation(host), kind.name
            if target is after:  # the full numbering was left behind, not grown past its limit
                assert learning.sides.numbering([])[0].table_size() == DEMANDS_LIMIT
