"""Aliyun's binpack and HAMi's spread."""

from __future__ import annotations

from gpushare.contract import PodRequest
from gpushare.model import Node
from gpushare.policies.base import Candidate, pick_gpus


class Binpack:
    """Tightest GPU that fits (ties: lowest index); prefer the node where that GPU is tightest.

    The node score is the fraction of the chosen GPUs' memory in use after placing the pod, so a pod
    that fills a GPU exactly scores 1.0. A pod without GPUs scores the same everywhere it fits: binpack
    ranks GPU placements only, so the tie-break (kube-scheduler's own scoring in a cluster) decides.
    """

    name = "binpack"

    def evaluate(self, node: Node, request: PodRequest) -> Candidate | None:
        if not node.fits_host_resources(request):
            return None
        if request.gpu_count == 0:
            return Candidate(0.0, ())
        hosts = node.hosts(request)
        if len(hosts) < request.gpu_count:
            return None
        order = sorted(hosts, key=lambda g: (g.free, g.index))
        chosen = pick_gpus(hosts, request.gpu_count, order)
        total = sum(g.total for g in chosen)
        left = sum(g.free for g in chosen) - (0 if request.exclusive else request.total)
        return Candidate(1.0 - left / total if total else 0.0, tuple(g.index for g in chosen))

    def observe(self, request: PodRequest) -> None:
        return None


class Spread:
    """Emptiest GPU, and the node with the most free GPU memory left afterwards (HAMi's spread). A pod
    without GPUs scores the same everywhere it fits, as with binpack."""

    name = "spread"

    def evaluate(self, node: Node, request: PodRequest) -> Candidate | None:
        if not node.fits_host_resources(request):
            return None
        if request.gpu_count == 0:
            return Candidate(0.0, ())
        hosts = node.hosts(request)
        if len(hosts) < request.gpu_count:
            return None
        order = sorted(hosts, key=lambda g: (-g.free, g.index))
        chosen = pick_gpus(hosts, request.gpu_count, order)
        capacity = sum(g.total for g in node.gpus if g.healthy)
        left = sum(g.free for g in node.gpus) - (sum(g.free for g in chosen) if request.exclusive else request.total)
        return Candidate(left / capacity if capacity else 0.0, tuple(g.index for g in chosen))

    def observe(self, request: PodRequest) -> None:
        return None
