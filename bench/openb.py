"""The Alibaba openb GPU-sharing trace (cluster-trace-gpu-v2023) as gpushare objects.

Everything a replay needs, for the in-process replay here and for an end-to-end replay through a local
cluster and the extender: the nodes (as ``Node`` objects and as a ``ClusterSpec``), and for each seed the
ordered pod list of the paper's protocol with each pod's ``PodRequest`` (and a ``PodInfo`` that
``parse_request`` turns into the same request).

Modelling choices (see docs/policies.md):
* every trace GPU is 1000 memory units (``memoryMiB: 1000`` in the cluster spec, unit MiB), so a pod's
  ``gpu_milli`` is its per-GPU share in units, one to one;
* ``gpu_spec`` (``V100M16|V100M32`` = either model) becomes the pod's model rule;
* pods with ``num_gpu == 0`` are CPU-only: ``PodRequest(gpu_count=0, per_gpu=0)``; they take CPU and memory
  on a GPU node and go through the same policy, as in the paper's simulator.

Data: Alibaba Cluster Trace Program, cluster-trace-gpu-v2023 (CC BY 4.0).
"""

from __future__ import annotations

import csv
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpushare.clusterspec import ClusterSpec, GPUSpec, NodeSpec
from gpushare.contract import (
    ANN_GPU_MODEL,
    RESOURCE_GPU_COUNT,
    RESOURCE_GPU_MEM,
    ContainerInfo,
    ModelRule,
    PodInfo,
    PodRequest,
    model_rule,
)
from gpushare.model import GPU, Node

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "openb"
NODE_FILE = "openb_node_list_gpu_node.csv"
# The shared folder's nine pod lists, by family: the default, model constraints, multi-GPU demand, fractional
# pods and CPU-only work (``--suite shared`` replays them all).
TRACES = {
    "default": "openb_pod_list_default.csv",
    "gpuspec10": "openb_pod_list_gpuspec10.csv",
    "gpuspec20": "openb_pod_list_gpuspec20.csv",
    "multigpu20": "openb_pod_list_multigpu20.csv",
    "multigpu30": "openb_pod_list_multigpu30.csv",
    "gpushare40": "openb_pod_list_gpushare40.csv",
    "gpushare60": "openb_pod_list_gpushare60.csv",
    "cpu050": "openb_pod_list_cpu050.csv",
    "cpu100": "openb_pod_list_cpu100.csv",
}
GPU_UNITS = 1000
TUNE_FACTOR = 1.3
SEEDS = tuple(range(42, 52))
NAMESPACE = "openb"


class TraceError(ValueError):
    """The trace files are missing or malformed; the text says which and what to do."""


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int
    model: str

    def node(self) -> Node:
        gpus = [GPU(index=i, model=self.model, total=GPU_UNITS) for i in range(self.gpu_count)]
        return Node(name=self.name, gpus=gpus, cpu_milli=self.cpu_milli, memory_mib=self.memory_mib)

    def spec(self) -> NodeSpec:
        gpus = [GPUSpec(model=self.model, memoryMiB=GPU_UNITS) for _ in range(self.gpu_count)]
        return NodeSpec(name=self.name, cpu=f"{self.cpu_milli}m", memory=f"{self.memory_mib}Mi", gpus=gpus)


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: str = ""

    @property
    def gpu_demand(self) -> int:
        """GPU units the pod asks for in all (the paper's num_gpu * gpu_milli)."""
        return self.num_gpu * self.gpu_milli

    def models(self) -> ModelRule:
        return model_rule({ANN_GPU_MODEL: self.gpu_spec} if self.gpu_spec else {})

    def request(self) -> PodRequest:
        per_gpu = self.gpu_milli if self.num_gpu else 0
        return PodRequest(per_gpu=per_gpu, gpu_count=self.num_gpu, models=self.models(),
                          cpu_milli=self.cpu_milli, memory_mib=self.memory_mib)

    def pod_info(self) -> PodInfo:
        """The pod as a cluster would hold it (unit MiB, GPUs of 1000 MiB): one container asking for the
        share in ``aliyun.com/gpu-mem`` and the GPU count in ``aliyun.com/gpu-count``."""
        limits = {"cpu": f"{self.cpu_milli}m", "memory": f"{self.memory_mib}Mi"}
        if self.num_gpu:
            limits[RESOURCE_GPU_MEM] = str(self.gpu_demand)
            limits[RESOURCE_GPU_COUNT] = str(self.num_gpu)
        annotations = {ANN_GPU_MODEL: self.gpu_spec} if self.gpu_spec else {}
        container = ContainerInfo(name="main", limits=limits, requests=limits)
        return PodInfo(namespace=NAMESPACE, name=self.name, uid=self.name, annotations=annotations,
                       containers=(container,))


POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


def _rows(path: Path, columns: Iterable[str]) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as exc:
        raise TraceError(f"Cannot read {path}: {exc.strerror}. Pass the openb folder with --data.") from None
    missing = [c for c in columns if rows and c not in rows[0]]
    if not rows or missing:
        raise TraceError(f"{path} has no rows or lacks the columns {', '.join(missing)}; is it an openb file?")
    return rows


def _int(row: dict[str, str], column: str, path: Path) -> int:
    try:
        return int(row[column])
    except (ValueError, TypeError):
        raise TraceError(f"{path}: {column}={row.get(column)!r} in row {row} is not an integer.") from None


def load_nodes(data_dir: Path = DEFAULT_DATA) -> list[TraceNode]:
    path = Path(data_dir) / NODE_FILE
    return [TraceNode(name=row["sn"], cpu_milli=_int(row, "cpu_milli", path),
                      memory_mib=_int(row, "memory_mib", path), gpu_count=_int(row, "gpu", path),
                      model=row["model"])
            for row in _rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model"))]


def trace_path(data_dir: Path, trace: str) -> Path:
    """The pod list of a named trace in ``data_dir``, or ``trace`` itself when it names a CSV file."""
    if trace in TRACES:
        return Path(data_dir) / TRACES[trace]
    if trace.endswith(".csv"):
        return Path(trace)
    raise TraceError(f"Unknown trace {trace!r}; choose one of {', '.join(TRACES)} or pass a pod list CSV file.")


def trace_name(trace: str) -> str:
    """How a trace is labelled in tables: its name, or a pod list file's name without the openb prefix."""
    if trace in TRACES:
        return trace
    return Path(trace).stem.removeprefix("openb_pod_list_")


def load_pods(data_dir: Path = DEFAULT_DATA, trace: str = "default") -> list[TracePod]:
    """The pods of a named trace in ``data_dir`` or of a pod list file (same columns as openb's)."""
    path = trace_path(data_dir, trace)
    return _pods(_rows(path, POD_COLUMNS), path)


def pod_rows(data_dir: Path, trace: str) -> list[dict[str, str]]:
    """The rows of ``load_pods``' file as read, every column kept (for writing a variant), their numbers checked."""
    path = trace_path(data_dir, trace)
    rows = _rows(path, POD_COLUMNS)
    _pods(rows, path)
    return rows


def _pods(rows: Iterable[dict[str, str]], path: Path) -> list[TracePod]:
    return [TracePod(name=row["name"], cpu_milli=_int(row, "cpu_milli", path),
                     memory_mib=_int(row, "memory_mib", path), num_gpu=_int(row, "num_gpu", path),
                     gpu_milli=_int(row, "gpu_milli", path), gpu_spec=row.get("gpu_spec") or "")
            for row in rows]


def capacity(nodes: Iterable[TraceNode]) -> int:
    """The cluster's GPU capacity in units (6212 GPUs x 1000 for openb)."""
    return sum(n.gpu_count for n in nodes) * GPU_UNITS


def arrival_order(pods: list[TracePod], seed: int, cluster_capacity: int,
                  factor: float = TUNE_FACTOR) -> list[TracePod]:
    """The paper's pod sequence for one seed: sorted by name, shuffled with the seed, then tuned to
    ``factor`` x capacity: extended with pods drawn uniformly with replacement until the total GPU demand
    would exceed it (drawn copies are named ``<name>-t<k>``), or, for a trace that asks for more, cut by
    removing pods at random until it no longer exceeds it."""
    rng = random.Random(seed)
    order = sorted(pods, key=lambda p: p.name)
    rng.shuffle(order)
    limit = factor * cluster_capacity
    demand = sum(p.gpu_demand for p in order)
    if demand > limit:
        while demand > limit:
            demand -= order.pop(rng.randrange(len(order))).gpu_demand
        return order
    originals = sorted(pods, key=lambda p: p.name)
    while originals:
        pick = originals[rng.randrange(len(originals))]
        if demand + pick.gpu_demand > limit:
            break
        demand += pick.gpu_demand
        order.append(TracePod(f"{pick.name}-t{len(order)}", pick.cpu_milli, pick.memory_mib, pick.num_gpu,
                              pick.gpu_milli, pick.gpu_spec))
    return order


def build_nodes(nodes: Iterable[TraceNode]) -> list[Node]:
    return [n.node() for n in nodes]


def cluster_spec(nodes: Iterable[TraceNode]) -> ClusterSpec:
    """The trace's cluster for the local cluster: every GPU 1000 MiB, so unit MiB equals gpu_milli."""
    return ClusterSpec(nodes=[n.spec() for n in nodes])
