"""Fake device IDs: one ``aliyun.com/gpu-mem`` device per memory unit of each GPU.

An ID is ``<GPU UUID>-_-<n>`` (Aliyun's scheme, so the kubelet's checkpoint keeps meaning the same after a
switch), where ``n`` counts the GPU's units from 0. The UUID, not the index, names the GPU, so an ID still
points at the same card if the driver renumbers GPUs after a reboot.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping

from deviceplugin.gpus import GPUDevice
from gpushare.contract import MemoryUnit

ID_SEPARATOR = "-_-"
# ``n`` as device_id writes it: ASCII digits without a sign or leading zeros, so that every device has exactly
# one ID; nine digits cover any GPU even in MiB units, and keep int() away from a caller's 4000-digit number.
_NUMBER = re.compile(r"0|[1-9][0-9]{0,8}")


def device_id(uuid: str, n: int) -> str:
    return f"{uuid}{ID_SEPARATOR}{n}"


def split_id(device: str) -> tuple[str, int]:
    """The GPU UUID and unit number of a device ID; ``ValueError`` when it is not one device_id could write."""
    uuid, separator, number = device.rpartition(ID_SEPARATOR)
    if not separator or not uuid or not _NUMBER.fullmatch(number):
        raise ValueError(f"Device ID {device[:80]!r} is not one of gpushare's (<GPU UUID>{ID_SEPARATOR}<n>).")
    return uuid, int(number)


def uuid_of(device: str) -> str:
    return split_id(device)[0]


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
            raise ValueError(f"Device ID {device[:80]!r} names GPU {uuid[:60]}, which this node does not have.")
        counts[index_by_uuid[uuid]] += 1
    return counts
