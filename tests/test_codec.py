"""The assignment codec: what the extender's bind writes, the device plugin and inspect read back identically.

Every component reads a pod's assignment through ``gpushare.contract.read_assignment`` and every writer encodes
it with ``Assignment.annotations``; these properties hold that one codec to its word for any assignment bind can
produce.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from deviceplugin.matching import choose, waiting_pods
from gpushare.contract import (
    ANN_AFFINITY,
    ANN_ANTI_AFFINITY,
    ANN_COMPUTE,
    ANN_COMPUTE_LIMIT,
    ANN_EXCLUSION,
    ANN_EXCLUSIVE,
    ANN_GPU_COUNT,
    RESOURCE_GPU_MEM,
    ContainerInfo,
    MemoryUnit,
    NodeInfo,
    PodInfo,
    new_assignment,
    parse_request,
    read_assignment,
)
from gpushare.model import placement_of
from inspect_cli.report import node_report


@st.composite
def bound_pods(draw: st.DrawFn) -> tuple[PodInfo, tuple[int, ...], int, MemoryUnit]:
    """A pod as kube-scheduler creates it, bound with the annotations the extender's bind writes."""
    count = draw(st.integers(1, 8))
    shares = draw(st.lists(st.integers(1, 40), min_size=1, max_size=4))
    shares[-1] += -sum(shares) % count  # the total must split evenly across the GPUs
    containers = tuple(ContainerInfo(name=f"c{i}", limits={RESOURCE_GPU_MEM: str(units)})
                       for i, units in enumerate(shares))
    annotations = {ANN_GPU_COUNT: str(count)}
    exclusive = draw(st.booleans())
    if exclusive:
        annotations[ANN_EXCLUSIVE] = "true"
    compute = draw(st.integers(0, 100))
    if compute:
        annotations[ANN_COMPUTE] = str(compute)
    if draw(st.booleans()):
        annotations[ANN_COMPUTE_LIMIT] = str(draw(st.integers(max(compute, 1), 100)))
    values = st.sampled_from(["", "red", "team-a.b_c"])
    for name in (ANN_ANTI_AFFINITY, ANN_EXCLUSION) if exclusive else (ANN_AFFINITY, ANN_ANTI_AFFINITY, ANN_EXCLUSION):
        if value := draw(values):
            annotations[name] = value
    pod = PodInfo(namespace="team", name="job", uid="u-1", node_name="n1", annotations=annotations,
                  containers=containers)
    gpus = tuple(draw(st.permutations(range(16)))[:count])
    gpu_memory = draw(st.integers(1, 100_000))
    unit = draw(st.sampled_from(list(MemoryUnit)))
    written = new_assignment(parse_request(pod), gpus, gpu_memory, unit, draw(st.integers(0, 2**63)))
    return replace(pod, annotations={**annotations, **written.annotations()}), gpus, gpu_memory, unit


@settings(max_examples=300, deadline=None)
@given(bound_pods())
def test_what_bind_writes_reads_back_identically(case: tuple[PodInfo, tuple[int, ...], int, MemoryUnit]) -> None:
    pod, gpus, gpu_memory, unit = case
    request = parse_request(pod)
    assignment = read_assignment(pod)
    assert assignment is not None
    assert assignment == new_assignment(request, gpus, gpu_memory, unit, assignment.assume_time_ns)
    assert assignment.annotations().items() <= pod.annotations.items()
    assert (assignment.per_gpu, assignment.total) == (request.per_gpu, request.total)
    assert (assignment.exclusive, assignment.compute_percent) == (request.exclusive, request.compute_percent)
    assert (assignment.compute_limit, assignment.sharing) == (request.compute_limit, request.sharing)
    assert dict(assignment.container_shares) == dict(request.container_shares)


@settings(max_examples=200, deadline=None)
@given(bound_pods())
def test_the_device_plugin_reads_what_bind_wrote(case: tuple[PodInfo, tuple[int, ...], int, MemoryUnit]) -> None:
    pod, gpus, _, _ = case
    request = parse_request(pod)
    [waiting] = waiting_pods([pod])
    assert waiting.assignment == read_assignment(pod)
    assert waiting.containers == tuple((c.name, request.container_shares[c.name]) for c in pod.containers)
    first, units = waiting.containers[0]
    # The kubelet gives the first container devices spread evenly over the extender's GPUs when it can.
    spread = Counter(dict.fromkeys(gpus, units // len(gpus))) if units % len(gpus) == 0 else Counter({gpus[0]: units})
    matches = choose([waiting], [(units, spread)])
    assert matches is not None
    [match] = matches
    assert (match.container, match.units, match.gpus) == (first, units, gpus)


@settings(max_examples=200, deadline=None)
@given(bound_pods())
def test_inspect_and_the_extender_account_what_bind_wrote(
        case: tuple[PodInfo, tuple[int, ...], int, MemoryUnit]) -> None:
    pod, gpus, _, _ = case
    request = parse_request(pod)
    placement = placement_of(pod, read_assignment(pod))
    assert (placement.gpu_indices, placement.per_gpu) == (gpus, request.per_gpu)
    assert (placement.exclusive, placement.compute_percent) == (request.exclusive, request.compute_percent)
    assert placement.sharing == request.sharing
    node = NodeInfo(name="n1", capacity={"aliyun.com/gpu-count": "16", RESOURCE_GPU_MEM: str(16 * 1000)})
    report = node_report(node, [pod])
    [usage] = report.pods
    per_gpu = 1000 if request.exclusive else request.per_gpu  # an exclusive pod holds its GPUs whole
    assert usage.by_gpu == dict.fromkeys(gpus, per_gpu) and not usage.assigned
