"""The GPUs of one node as the device plugin sees them, and the interface every discovery backend implements.

Two backends exist: ``nvml`` (the real driver, through pynvml) and ``simulated`` (the YAML cluster
description, with injectable XID events and memory usage). Everything above this seam is backend-agnostic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

# XIDs that report an application fault rather than a broken GPU: 31 (memory page fault), 43 (GPU stopped
# processing because the application hit a SW error) and 45 (preemptive cleanup after an application ends).
APPLICATION_XIDS = frozenset({31, 43, 45})


@dataclass(frozen=True)
class GPUDevice:
    index: int
    uuid: str
    model: str
    memory_mib: int
    minor: int | None = None
    numa: int | None = None
    links: Mapping[int, int] = field(default_factory=dict)
    """HAMi pair score with each peer GPU index (PCIe distance, or 100 per NVLink)."""


@dataclass(frozen=True)
class XidEvent:
    gpu_index: int
    xid: int

    @property
    def critical(self) -> bool:
        return self.xid not in APPLICATION_XIDS


@dataclass(frozen=True)
class ProcessUsage:
    """GPU memory held by one container's processes on one GPU."""

    gpu_index: int
    used_mib: int
    pod_uid: str
    container_id: str = ""


class GPUBackend(Protocol):
    """Discovery and monitoring of a node's GPUs."""

    def discover(self) -> list[GPUDevice]:
        """The node's GPUs; an empty list (after one clear log line) when there is no driver or no GPU."""
        ...

    def used_mib(self) -> dict[int, int]:
        """Memory in use on each GPU, by index, for GPUs that report it."""
        ...

    def process_usage(self) -> list[ProcessUsage]:
        """Memory per container and GPU, where the backend can tell which pod a process belongs to."""
        ...

    def wait_event(self, timeout_s: float) -> XidEvent | None:
        """Block up to ``timeout_s`` for the next XID event; ``None`` on timeout."""
        ...

    def close(self) -> None: ...
