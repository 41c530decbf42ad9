"""The victim search: the smallest set of lower-priority pods whose eviction lets a GPU pod fit, per GPU."""

from __future__ import annotations

from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.contract import ModelRule, PodInfo, PodRequest, may_preempt, pod_priority
from gpushare.model import GPU, Node, Placement
from gpushare.preemption import Held, find_victims, hold


def node(*gpus: tuple[str, int], cpu: int = 0) -> Node:
    return Node(name="n", gpus=[GPU(index=i, model=m, total=t) for i, (m, t) in enumerate(gpus)], cpu_milli=cpu)


def put(state: Node, key: str, gpus: tuple[int, ...], per_gpu: int, priority: int, exclusive: bool = False,
        cpu: int = 0) -> None:
    state.add(key, Placement(gpus, per_gpu, exclusive=exclusive, cpu_milli=cpu, priority=priority, uid="uid-" + key))


def keys(found: object) -> list[str]:
    assert found is not None
    return [v.key for v in found.victims]  # type: ignore[attr-defined]


def test_evicts_on_the_gpu_the_pod_can_use_not_the_lowest_priority_pod_elsewhere() -> None:
    state = node(("T4", 16), ("T4", 16))
    put(state, "low-on-0", (0,), 8, priority=1)
    put(state, "mid-on-1", (1,), 12, priority=5)
    put(state, "other-on-1", (1,), 4, priority=5)
    # 10 units: GPU 0 frees enough once its one low pod goes; GPU 1 would need one pod too, of priority 5.
    assert keys(find_victims(state, PodRequest(per_gpu=10, priority=10))) == ["low-on-0"]
    # 14 units: GPU 1 would need both its pods to go, GPU 0 one.
    assert keys(find_victims(state, PodRequest(per_gpu=14, priority=10))) == ["low-on-0"]


def test_model_constraints_choose_the_gpu() -> None:
    state = node(("T4", 16), ("A100", 40))
    put(state, "t4-pod", (0,), 16, priority=0)
    put(state, "a100-pod", (1,), 40, priority=3)
    found = find_victims(state, PodRequest(per_gpu=8, priority=10, models=ModelRule(("a100",))))
    assert keys(found) == ["a100-pod"]


def test_never_evicts_equal_or_higher_priority_and_vetoes_when_nothing_else_helps() -> None:
    state = node(("T4", 16))
    put(state, "same", (0,), 16, priority=10)
    assert find_victims(state, PodRequest(per_gpu=4, priority=10)) is None


def test_a_pod_that_fits_needs_no_victims_and_gets_none() -> None:
    state = node(("T4", 16))
    put(state, "low", (0,), 4, priority=0)
    assert find_victims(state, PodRequest(per_gpu=4, priority=10)) is None


def test_multi_gpu_pod_needs_room_on_k_gpus_and_a_multi_gpu_victim_frees_all_of_its() -> None:
    state = node(("T4", 16), ("T4", 16), ("T4", 16))
    put(state, "wide", (0, 1), 12, priority=1)
    put(state, "a", (2,), 12, priority=0)
    # Two GPUs with 8 free: evicting "wide" alone frees GPUs 0 and 1.
    assert keys(find_victims(state, PodRequest(per_gpu=8, gpu_count=2, priority=5))) == ["wide"]
    # Three GPUs: both must go, highest priority listed first.
    assert keys(find_victims(state, PodRequest(per_gpu=8, gpu_count=3, priority=5))) == ["wide", "a"]


def test_exclusive_pod_needs_an_idle_gpu() -> None:
    state = node(("T4", 16), ("T4", 16))
    put(state, "small-low", (0,), 2, priority=0)
    put(state, "small-high", (0,), 2, priority=3)
    put(state, "big", (1,), 10, priority=2)
    assert keys(find_victims(state, PodRequest(per_gpu=16, exclusive=True, priority=5))) == ["big"]


def test_cpu_counts_too() -> None:
    state = node(("T4", 16), cpu=1000)
    put(state, "gpu-low", (0,), 16, priority=0, cpu=100)
    put(state, "cpu-hog", (), 0, priority=1, cpu=800)
    found = find_victims(state, PodRequest(per_gpu=8, cpu_milli=500, priority=5))
    assert sorted(keys(found)) == ["cpu-hog", "gpu-low"]


def test_pdb_count_breaks_ties_with_kube_schedulers_victims() -> None:
    state = node(("T4", 16), ("T4", 16))
    put(state, "x", (0,), 16, priority=1)
    put(state, "y", (1,), 16, priority=1)
    # kube-scheduler proposed "x" and counted one violation for it: "y" is as good and charged none.
    found = find_victims(state, PodRequest(per_gpu=8, priority=5), kube_victims={"uid-x"}, kube_violations=1)
    assert found is not None and keys(found) == ["y"] and found.pdb_violations == 0


def test_opportunistic_pods_never_preempt() -> None:
    state = node(("T4", 16))
    put(state, "low", (0,), 16, priority=0)
    assert find_victims(state, PodRequest(per_gpu=4, priority=10, preempts=False)) is None
    assert not may_preempt(PodInfo("ns", "p", labels={"sharedgpu/priority": "0"}))
    assert not may_preempt(PodInfo("ns", "p", priority=100, preemption_policy="Never"))
    assert may_preempt(PodInfo("ns", "p", labels={"sharedgpu/priority": "7"}))
    assert pod_priority(PodInfo("ns", "p", labels={"sharedgpu/priority": "7"})) == 7
    assert pod_priority(PodInfo("ns", "p", priority=3, labels={"sharedgpu/priority": "7"})) == 3


def test_nominated_pods_hold_their_room() -> None:
    state = node(("T4", 16))
    put(state, "low", (0,), 8, priority=0)
    held = [Held("default/nominated", PodRequest(per_gpu=8, priority=20))]
    assert not hold(state, held).fits(PodRequest(per_gpu=8, priority=10))
    assert keys(find_victims(state, PodRequest(per_gpu=8, priority=10), held=held)) == ["low"]
    # A nominated pod whose victims are still leaving holds its memory all the same: nothing is left to free.
    waiting = [Held("default/nominated", PodRequest(per_gpu=12, priority=20))]
    assert find_victims(state, PodRequest(per_gpu=8, priority=10), held=waiting) is None


# -- properties ----------------------------------------------------------------------------------------------

MODELS = ("T4", "A100")


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Node, PodRequest]:
    gpus = draw(st.lists(st.tuples(st.sampled_from(MODELS), st.sampled_from([8, 16])), min_size=1, max_size=4))
    state = node(*gpus, cpu=draw(st.sampled_from([0, 4000])))
    for i in range(draw(st.integers(0, 7))):
        count = draw(st.integers(1, len(gpus)))
        indices = tuple(sorted(draw(st.permutations(range(len(gpus))))[:count]))
        per_gpu = draw(st.integers(1, 8))
        exclusive = draw(st.booleans()) and count == 1
        placement = Placement(indices, per_gpu, exclusive=exclusive, cpu_milli=draw(st.sampled_from([0, 1000])),
                              priority=draw(st.integers(0, 5)), uid=f"uid-{i}")
        try:
            state.add(f"p{i}", placement, strict=True)
        except ValueError:
            continue
    request = PodRequest(per_gpu=draw(st.integers(1, 16)), gpu_count=draw(st.integers(1, 2)),
                         exclusive=draw(st.booleans()), priority=draw(st.integers(0, 6)),
                         models=ModelRule(tuple(draw(st.sets(st.sampled_from(["t4", "a100"]), max_size=1)))),
                         cpu_milli=draw(st.sampled_from([0, 1000])))
    return state, request


def evicted(state: Node, victims: list[str]) -> Node:
    scratch = Node(name=state.name, gpus=[GPU(g.index, g.model, g.total) for g in state.gpus],
                   cpu_milli=state.cpu_milli)
    for key, placement in state.placements.items():
        if key not in victims:
            scratch.add(key, placement, strict=True)
    return scratch


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_victims_free_enough_never_overcommit_and_spare_higher_priority(scenario: tuple[Node, PodRequest]) -> None:
    state, request = scenario
    found = find_victims(state, request)
    lower = [k for k, p in state.placements.items() if p.priority < request.priority]
    if found is None:
        # Vetoed only when the pod fits already or not even evicting every lower-priority pod makes room.
        assert state.fits(request) or not evicted(state, lower).fits(request)
        return
    victims = keys(found)
    assert victims, "never an empty victim list"
    assert all(state.placements[k].priority < request.priority for k in victims)
    assert [v.priority for v in found.victims] == sorted((v.priority for v in found.victims), reverse=True)
    after = evicted(state, victims)
    assert after.fits(request)
    # Placing the pod on the freed node keeps every GPU within its capacity.
    hosts = after.hosts(request)[:request.gpu_count]
    after.place("preemptor", request, [g.index for g in hosts])
    assert all(g.used <= g.total and g.compute_used <= 100 for g in after.gpus)
    # And no smaller set of lower-priority pods would do.
    for smaller in combinations(lower, len(victims) - 1):
        assert not evicted(state, list(smaller)).fits(request)
