"""Fake device IDs: one ``aliyun.com/gpu-mem`` device per memory unit of each GPU.

An ID is ``<GPU UUID>-_-<n>`` (Aliyun's scheme, so the kubelet's checkpoint keeps meaning the same after a
switch), where ``n`` counts the GPU's units from 0. The UUID, not the index, names the GPU, so an ID still
points at the same card if the driver renumbers GPUs after a reboot.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from deviceplugin.gpus import GPUDevice
from gpushare.contract import MemoryUnit

ID_SEPARATOR = "-_-"


def device_id(uuid: str, n: int) -> str:
    return f"{uuid}{ID_SEPARATOR}{n}"


def uuid_of(device: str) -> str:
    uuid, separator, number = device.rpartition(ID_SEPARATOR)
    if not separator or not uuid or not number.isdigit():
        raise ValueError(f"Device ID {device!r} is not one of gpushare's (<GPU UUID>{ID_SEPARATOR}<n>).")
    return uuid


def units_of(gpu: GPUDevice, unit: MemoryUnit) -> int:
    """How many devices a GPU advertises: its memory rounded to the nearest unit."""
    return unit.from_mib(gpu.memory_mib)


def device_ids(gpu: GPUDevice, unit: MemoryUnit) -> list[str]:
    return [device_id(gpu.uuid, n) for n in range(units_of(gpu, unit))]


def gpus_of(devices: Iterable[str], index_by_uuid: Mapping[str, int]) -> Counter[int]:
    """How many of the given devices each GPU provides; raise ``ValueError`` on an ID of no known GPU."""
    counts: Counter[int] = Counter()
    for device in devices:
        uuid = uuid_of(device)
        if uuid not in index_by_uuid:
            raise ValueError(f"Device ID {device!r} names GPU {uuid}, which this node does not have.")
        counts[index_by_uuid[uuid]] += 1
    return counts
