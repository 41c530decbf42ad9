"""Baselines of the FGD paper that gpushare does not ship, for the trace replay only.

``bestfit`` is the paper simulator's BestFit, not Aliyun's binpack: the node score is 100 x (1 - the mean
of the node's CPU left after placement over 128 cores and its GPU left over 8 GPUs), truncated to an
integer (its constants: MaxSpecCpu 128000 milli, MaxSpecGpu 8000 milli); on the node, the fitting GPU with
the least free memory. Binpack instead ranks nodes by how full the chosen GPU is left.
"""

from __future__ import annotations

from gpushare.contract import PodRequest
from gpushare.model import Node
from gpushare.policies import Candidate
from gpushare.policies.simple import choose_gpus, memory_taken

MAX_SPEC_CPU_MILLI = 128_000
MAX_SPEC_GPUS = 8


class PaperBestFit:
    name = "bestfit"

    def evaluate(self, node: Node, request: PodRequest) -> Candidate | None:
        chosen = choose_gpus(node, request, lambda g: (g.free, g.index))
        if chosen is None:
            return None
        gpu_size = max((g.total for g in node.gpus), default=0) or 1
        taken = memory_taken(request, chosen)
        gpus_left = (sum(g.free for g in node.gpus) - taken) / gpu_size
        cpu_left = node.cpu_milli - node.cpu_used - request.cpu_milli
        left = 0.5 * cpu_left / MAX_SPEC_CPU_MILLI + 0.5 * gpus_left / MAX_SPEC_GPUS
        return Candidate(float(int((1.0 - left) * 100)), tuple(g.index for g in chosen))

    def observe(self, request: PodRequest) -> None:
        return None
