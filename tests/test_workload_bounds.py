"""What the learning policies learn is bounded: no stream of requests, however absurd, breaks a later decision."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from extender.placement import PolicyBook
from gpushare.contract import MAX_GPU_COUNT, ModelRule, PodRequest
from gpushare.model import GPU, Node
from gpushare.policies.workload import MAX_SHAPES, Shape, WorkloadDistribution
from gpushare.quantity import INT64_MAX

MODELS = ("Tesla-T4", "Tesla-V100-SXM2-32GB")

# Anything a request can carry once it has been read: the parser bounds amounts to int64 and counts to 64.
amounts = st.one_of(st.integers(0, 64), st.integers(0, INT64_MAX), st.sampled_from([0, 1, INT64_MAX]))
absurd_shapes = st.builds(
    Shape, gpu_count=st.integers(0, MAX_GPU_COUNT), per_gpu=amounts, cpu_milli=amounts, exclusive=st.booleans(),
    models=st.builds(ModelRule, st.lists(st.text(max_size=20), max_size=3).map(tuple),
                     st.lists(st.sampled_from((*MODELS, "x")), max_size=2).map(tuple), st.booleans()))

ordinary = st.builds(PodRequest, per_gpu=st.integers(1, 16), gpu_count=st.integers(1, 4), exclusive=st.booleans(),
                     cpu_milli=st.integers(0, 8000))


def cluster() -> list[Node]:
    nodes = []
    for i, (model, size, count) in enumerate([(MODELS[0], 15, 2), (MODELS[1], 32, 4), (MODELS[0], 15, 8)]):
        node = Node(name=f"n{i}", gpus=[GPU(index=g, model=model, total=size) for g in range(count)],
                    cpu_milli=32_000, memory_mib=256_000)
        # Some memory already taken, so that decisions are not all on empty GPUs.
        node.gpus[0].used = size // 3
        node.gpus[0].holders = 1
        nodes.append(node)
    return nodes


def assert_valid(node: Node, request: PodRequest, gpus: tuple[int, ...]) -> None:
    assert len(gpus) == len(set(gpus)) == request.gpu_count
    for index in gpus:
        gpu = node.gpu(index)
        assert gpu is not None, f"GPU {index} does not exist on {node.name}"
        assert gpu.healthy and not gpu.exclusive
        assert (gpu.holders == 0 and gpu.used == 0) if request.exclusive else gpu.free >= request.per_gpu
    node.place("default/p", request, gpus)  # raises on any overcommit
    assert all(0 <= g.used <= g.total for g in node.gpus)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=st.lists(absurd_shapes, max_size=80), repeat=st.integers(1, 40), pods=st.lists(ordinary, min_size=1,
                                                                                             max_size=6))
def test_no_request_stream_breaks_a_later_decision(stream: list[Shape], repeat: int, pods: list[PodRequest]) -> None:
    book = PolicyBook("fgd-lookahead")
    # Straight into the distribution: the extender learns every pod kube-scheduler asks about, whatever its shape,
    # so the policies must survive any of them.
    for _ in range(repeat):
        for shape in stream:
            book.workload.observe(shape)
    assert len(book.workload.histogram()) <= MAX_SHAPES
    for request in pods:
        for name in ("fgd-lookahead", "fgd", "binpack", "spread"):
            policy = book.for_request(PodRequest(**{**request.__dict__, "policy": name}))
            for node in cluster():
                candidate = book.evaluate(policy, node, request)
                if candidate is not None:
                    assert_valid(node, request, candidate.gpus)
                elif node.fits(request):
                    # The policy may decline only where the request does not fit (a failure counts as declining,
                    # and would show here as a fitting node with no answer).
                    raise AssertionError(f"{name} declined {request} on {node.name}, where it fits")


def test_the_distinct_shapes_are_capped() -> None:
    workload = WorkloadDistribution()
    for per_gpu in range(MAX_SHAPES * 3):
        workload.observe(Shape(gpu_count=1, per_gpu=per_gpu))
    assert len(workload.histogram()) == MAX_SHAPES
    # The newest shapes stay: the lightest (oldest, decayed) ones made room.
    assert Shape(gpu_count=1, per_gpu=MAX_SHAPES * 3 - 1) in workload.histogram()


def test_a_full_histogram_makes_room_by_dropping_its_lightest_shape_not_its_oldest() -> None:
    workload = WorkloadDistribution()
    common = Shape(gpu_count=1, per_gpu=10_000)
    for _ in range(50):
        workload.observe(common)
    for per_gpu in range(MAX_SHAPES - 1):
        workload.observe(Shape(gpu_count=1, per_gpu=per_gpu))
    workload.observe(Shape(gpu_count=1, per_gpu=MAX_SHAPES))
    kept = workload.histogram()
    assert len(kept) == MAX_SHAPES
    # The first shape seen once weighs least (weights decay): it goes, the older shape seen fifty times stays.
    assert Shape(gpu_count=1, per_gpu=0) not in kept
    assert common in kept and Shape(gpu_count=1, per_gpu=1) in kept


def test_a_seed_with_an_infinite_weight_is_refused() -> None:
    workload = WorkloadDistribution()
    try:
        workload.seed({Shape(gpu_count=1, per_gpu=1): float("inf")})
    except ValueError as exc:
        assert "positive, finite weight" in str(exc)
    else:
        raise AssertionError("an infinite seed weight was accepted")
