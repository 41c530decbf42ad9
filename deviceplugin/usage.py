"""Which containers use more GPU memory than their share. Pure: usage samples and pods in, findings out."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from deviceplugin.gpus import ProcessUsage
from deviceplugin.matching import split_evenly
from gpushare.contract import MemoryUnit, PodInfo, read_assignment


@dataclass(frozen=True)
class Overuse:
    pod: str
    container: str
    """Empty when the backend cannot tell the pod's containers apart; the share is then the pod's."""
    gpu_index: int
    used_mib: int
    share_mib: int


def find_overuse(samples: Iterable[ProcessUsage], pods: Iterable[PodInfo], unit: MemoryUnit,
                 container_names: Mapping[str, str]) -> list[Overuse]:
    """Containers whose processes hold more memory on a GPU than their share of it.

    ``container_names`` maps runtime container IDs to names (from the pods' status).
    """
    used: dict[tuple[str, str, int], int] = defaultdict(int)
    for sample in samples:
        used[(sample.pod_uid, container_names.get(sample.container_id, ""), sample.gpu_index)] += sample.used_mib
    by_uid = {p.uid: p for p in pods if p.uid}
    found = []
    for (uid, container, gpu), mib in sorted(used.items()):
        pod = by_uid.get(uid)
        assignment = read_assignment(pod) if pod is not None else None
        if pod is None or assignment is None or assignment.exclusive or gpu not in assignment.gpu_indices:
            continue
        count = len(assignment.gpu_indices)
        units = assignment.container_shares.get(container) if container else None
        if units is None:
            container = ""
            share = assignment.per_gpu * unit.mib
        else:
            share = split_evenly(units * unit.mib, count)[assignment.gpu_indices.index(gpu)]
        if mib > share:
            found.append(Overuse(pod.key, container, gpu, mib, share))
    return found
