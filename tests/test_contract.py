"""The annotation and resource contract: parsing requests, writing and reading assignments."""

from __future__ import annotations

import json

import pytest

from gpushare import contract
from gpushare.contract import (
    ContainerInfo,
    GPUInventoryEntry,
    MemoryUnit,
    PodInfo,
    RequestError,
    decode_inventory,
    encode_inventory,
    new_assignment,
    parse_request,
    read_assignment,
    requests_gpu,
)
from gpushare.quantity import QuantityError, parse_quantity, to_mib, to_milli


def pod(*containers: ContainerInfo, annotations: dict[str, str] | None = None) -> PodInfo:
    return PodInfo(namespace="ns", name="p", containers=containers, annotations=annotations or {})


def gpu(name: str, mem: str, count: str | None = None, **extra: str) -> ContainerInfo:
    limits = {contract.RESOURCE_GPU_MEM: mem, **extra}
    if count is not None:
        limits[contract.RESOURCE_GPU_COUNT] = count
    return ContainerInfo(name=name, limits=limits)


@pytest.mark.parametrize(("mib", "unit", "expected"), [
    (16160, MemoryUnit.GiB, 16),   # a "16 GB" V100 reports 16160 MiB: Aliyun's flooring showed 15
    (15360, MemoryUnit.GiB, 15),
    (81920, MemoryUnit.GiB, 80),
    (16160, MemoryUnit.MiB, 16160),
])
def test_memory_rounds_to_nearest_unit(mib: int, unit: MemoryUnit, expected: int) -> None:
    assert unit.from_mib(mib) == expected


def test_quantities_parse_like_kubernetes() -> None:
    assert to_milli("500m") == 500
    assert to_milli("2") == 2000
    assert to_mib("4Gi") == 4096
    assert to_mib("1G") == 954
    assert parse_quantity("1e3") == 1000
    with pytest.raises(QuantityError, match="not a Kubernetes quantity"):
        parse_quantity("lots")


def test_request_sums_containers_and_keeps_each_share() -> None:
    request = parse_request(pod(gpu("main", "3"), gpu("sidecar", "1"), ContainerInfo(name="plain")))
    assert (request.per_gpu, request.gpu_count, request.total) == (4, 1, 4)
    assert dict(request.container_shares) == {"main": 3, "sidecar": 1}


def test_multi_gpu_request_splits_memory_evenly() -> None:
    request = parse_request(pod(gpu("main", "32", count="2")))
    assert (request.per_gpu, request.gpu_count) == (16, 2)
    by_annotation = parse_request(pod(gpu("main", "24"), annotations={contract.ANN_GPU_COUNT: "3"}))
    assert (by_annotation.per_gpu, by_annotation.gpu_count) == (8, 3)


def test_a_pod_without_gpushare_resources_is_placed_by_cpu_and_memory() -> None:
    request = parse_request(pod(ContainerInfo(name="main", requests={"cpu": "500m", "memory": "1Gi"})))
    assert (request.gpu_count, request.per_gpu, request.cpu_milli, request.memory_mib) == (0, 0, 500, 1024)


@pytest.mark.parametrize(("p", "message"), [
    (pod(gpu("main", "5", count="2")), "does not divide evenly"),
    (pod(ContainerInfo(name="main", limits={contract.RESOURCE_GPU_COUNT: "1"})), "asks for no aliyun.com/gpu-mem"),
    (pod(gpu("main", "two")), "is not a Kubernetes quantity"),
    (pod(gpu("main", "2"), annotations={contract.ANN_COMPUTE: "150"}), "whole percentage"),
    (pod(gpu("main", "2"), annotations={contract.ANN_POLICY: "magic"}), "placement policy 'magic'"),
    (pod(gpu("main", "2"), annotations={contract.ANN_GPU_COUNT: "zero"}), "whole number of GPUs"),
    (pod(gpu("main", "4", count="2"), annotations={contract.ANN_GPU_COUNT: "4"}), "keep one of them"),
])
def test_bad_requests_explain_themselves(p: PodInfo, message: str) -> None:
    with pytest.raises(RequestError, match=message):
        parse_request(p)


def test_requests_gpu_looks_at_init_containers_too() -> None:
    assert not requests_gpu(pod(ContainerInfo(name="plain", limits={"cpu": "1"})))
    init = PodInfo(namespace="ns", name="p", init_containers=(gpu("init", "1"),))
    assert requests_gpu(init)


def test_cpu_and_memory_follow_scheduler_rules() -> None:
    p = PodInfo(namespace="ns", name="p",
                containers=(ContainerInfo(name="a", limits={contract.RESOURCE_GPU_MEM: "1"},
                                          requests={"cpu": "500m", "memory": "1Gi"}),
                            ContainerInfo(name="b", requests={"cpu": "1", "memory": "512Mi"})),
                init_containers=(ContainerInfo(name="init", requests={"cpu": "4"}),))
    request = parse_request(p)
    assert (request.cpu_milli, request.memory_mib) == (4000, 1536)


def test_model_rules_and_aliases() -> None:
    ours = parse_request(pod(gpu("m", "1"), annotations={contract.ANN_GPU_MODEL: "V100M16|V100M32"}))
    assert ours.models.accepts("V100M32") and not ours.models.accepts("T4")
    assert not ours.models.accepts("V100M16-SXM2")  # our annotation matches names exactly
    hami = parse_request(pod(gpu("m", "1"), annotations={contract.HAMI_USE_GPUTYPE: "A100",
                                                          contract.HAMI_NOUSE_GPUTYPE: "40GB"}))
    assert hami.models.accepts("NVIDIA-A100-SXM4-80GB") and not hami.models.accepts("NVIDIA-A100-SXM4-40GB")
    kubeshare = PodInfo(namespace="ns", name="p", containers=(gpu("m", "1"),),
                        labels={contract.KUBESHARE_GPU_MODEL: "T4"})
    assert parse_request(kubeshare).models.accepts("t4")


def test_assignment_round_trips_through_annotations() -> None:
    request = parse_request(pod(gpu("a", "6", count="2"), gpu("b", "2"),
                                annotations={contract.ANN_COMPUTE: "30"}))
    written = new_assignment(request, [3, 1], 16, MemoryUnit.MiB, assume_time_ns=42)
    annotations = written.annotations()
    assert annotations[contract.ANN_IDX] == "3"
    assert annotations[contract.ANN_POD] == "8"
    assert annotations[contract.ANN_DEV] == "16"
    assert annotations[contract.ANN_ASSIGNED] == "false"
    assert annotations[contract.ANN_MEMORY_UNIT] == "MiB"
    assert json.loads(annotations[contract.ANN_CONTAINER_SHARES]) == {"a": 6, "b": 2}
    bound = PodInfo(namespace="ns", name="p", annotations={**annotations, contract.ANN_COMPUTE: "30"})
    assignment = read_assignment(bound)
    assert assignment == written
    assert (assignment.gpu_indices, assignment.per_gpu, assignment.compute_percent) == ((3, 1), 4, 30)


def test_aliyun_pods_without_our_annotations_read_as_one_gpu() -> None:
    legacy = PodInfo(namespace="ns", name="p", annotations={contract.ANN_IDX: "2", contract.ANN_POD: "5"})
    assignment = read_assignment(legacy)
    assert assignment is not None and assignment.gpu_indices == (2,) and assignment.per_gpu == 5
    assert read_assignment(PodInfo(namespace="ns", name="p", annotations={contract.ANN_IDX: "x"})) is None


def test_inventory_round_trip_and_bad_annotation() -> None:
    entries = [GPUInventoryEntry(index=1, model="T4", memory_mib=15360, numa=0, links={0: 100}),
               GPUInventoryEntry(index=0, model="A10", memory_mib=23028, used_mib=100)]
    decoded = decode_inventory(encode_inventory(entries))
    assert [e.index for e in decoded] == [0, 1]
    assert decoded[1].links == {0: 100} and decoded[0].used_mib == 100
    with pytest.raises(ValueError, match="restart the node's device plugin"):
        decode_inventory('{"index": 0}')
