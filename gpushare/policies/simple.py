"""Aliyun's binpack and HAMi's spread."""

from __future__ import annotations

from collections.abc import Callable

from gpushare.contract import PodRequest
from gpushare.model import GPU, Node
from gpushare.policies.base import Candidate, pick_gpus

NO_GPUS: tuple[GPU, ...] = ()


def choose_gpus(node: Node, request: PodRequest,
                preference: Callable[[GPU], tuple[int, int]]) -> tuple[GPU, ...] | None:
    """The GPUs a pod takes on ``node`` in the given order of preference; ``None`` if the pod does not fit."""
    if not node.fits_host_resources(request):
        return None
    if request.gpu_count == 0:
        return NO_GPUS
    hosts = node.hosts(request)
    if len(hosts) < request.gpu_count:
        return None
    return pick_gpus(hosts, request.gpu_count, sorted(hosts, key=preference))


def memory_taken(request: PodRequest, chosen: tuple[GPU, ...]) -> int:
    """Memory the pod takes from its GPUs: all of them when it holds them exclusively."""
    return sum(g.free for g in chosen) if request.exclusive else request.total


class Binpack:
    """Tightest GPU that fits (ties: lowest index); prefer the node where that GPU is tightest.

    The node score is the fraction of the chosen GPUs' memory in use after placing the pod, so a pod
    that fills a GPU exactly scores 1.0. A pod without GPUs scores the same everywhere it fits: binpack
    ranks GPU placements only, so the tie-break (kube-scheduler's own scoring in a cluster) decides.
    """

    name = "binpack"

    def evaluate(self, node: Node, request: PodRequest) -> Candidate | None:
        chosen = choose_gpus(node, request, lambda g: (g.free, g.index))
        if chosen is None:
            return None
        total = sum(g.total for g in chosen)
        left = sum(g.free for g in chosen) - memory_taken(request, chosen)
        return Candidate(1.0 - left / total if total else 0.0, tuple(g.index for g in chosen))

    def observe(self, request: PodRequest) -> None:
        return None


class Spread:
    """Emptiest GPU, and the node with the most free GPU memory left afterwards (HAMi's spread). A pod
    without GPUs scores the same everywhere it fits, as with binpack."""

    name = "spread"

    def evaluate(self, node: Node, request: PodRequest) -> Candidate | None:
        chosen = choose_gpus(node, request, lambda g: (-g.free, g.index))
        if chosen is None:
            return None
        if not chosen:
            return Candidate(0.0, ())
        capacity = sum(g.total for g in node.gpus if g.healthy)
        left = sum(g.free for g in node.gpus) - memory_taken(request, chosen)
        return Candidate(left / capacity if capacity else 0.0, tuple(g.index for g in chosen))

    def observe(self, request: PodRequest) -> None:
        return None
