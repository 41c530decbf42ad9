"""Text, JSON and YAML views of a ``ClusterReport``.

The default and ``-d`` tables keep Aliyun's layout so existing habits and scripts carry over; ``-o wide`` lists
one row per GPU with its model, health and the memory NVML reports in use.
"""

from __future__ import annotations

import json
from typing import Any

import yaml
from tabulate import tabulate

from gpushare.contract import ANN_ASSIGNED
from inspect_cli.report import ClusterReport, NodeReport, percent

RULE = "-" * 80
PENDING_HEADER = "PENDING(Allocated)"
PENDING_NOTE = (f"{PENDING_HEADER}: memory of pods bound to the node whose GPUs the device plugin has not allocated "
                f"yet ({ANN_ASSIGNED}=false); it is already counted in the GPU columns.")


def _table(rows: list[list[str]], headers: list[str]) -> str:
    return str(tabulate(rows, headers=headers, tablefmt="plain", disable_numparse=True, stralign="left"))


def _gpu_count(report: ClusterReport) -> int:
    return max((max(g.index for g in n.gpus) + 1 for n in report.nodes if n.gpus), default=0)


def _cluster_footer(report: ClusterReport) -> list[str]:
    return ["Allocated/Total GPU Memory In Cluster:",
            f"{report.allocated}/{report.total} ({percent(report.allocated, report.total)}%)"]


def _notes(report: ClusterReport) -> list[str]:
    defects = [f"{node.defect} Its GPUs are left out above." for node in report.nodes if node.defect]
    return defects + [f"Pod {key} on node {node.name} asks for GPU memory but was not placed by the gpushare extender; "
            "it uses a GPU nobody accounts for. Recreate it so that the scheduler sends it to the extender."
            for node in report.nodes for key in node.unplaced]


def summary(report: ClusterReport) -> str:
    """Aliyun's default view: one row per node, a cell per GPU."""
    count = _gpu_count(report)
    show_pending = any(n.pending for n in report.nodes)
    headers = ["NAME", "IPADDRESS", *(f"GPU{i}(Allocated/Total)" for i in range(count))]
    if show_pending:
        headers.append(PENDING_HEADER)
    headers.append(f"GPU Memory({report.unit.value})")
    rows = []
    for node in report.nodes:
        scale = report.scale(node)
        gpus = {g.index: g for g in node.gpus}
        cells = [f"{gpus[i].allocated * scale}/{gpus[i].total * scale}" if i in gpus else "-" for i in range(count)]
        row = [node.name, node.address, *cells]
        if show_pending:
            row.append(str(node.pending * scale))
        row.append(f"{node.allocated * scale}/{node.total * scale}")
        rows.append(row)
    lines = [_table(rows, headers), RULE, *_cluster_footer(report)]
    if show_pending:
        lines.append(PENDING_NOTE)
    return "\n".join(lines + _notes(report)) + "\n"


def _wide_rows(report: ClusterReport, node: NodeReport) -> list[list[str]]:
    scale = report.scale(node)
    return [[node.name, node.address, str(g.index), g.model, "Healthy" if g.healthy else "Unhealthy",
             f"{g.allocated * scale}/{g.total * scale}", str(g.pending * scale),
             "-" if g.nvml_used_mib is None else str(g.nvml_used_mib),
             str(sum(1 for p in node.pods if g.index in p.by_gpu))]
            for g in node.gpus]


def _wide_headers(report: ClusterReport) -> list[str]:
    unit = report.unit.value
    return ["NAME", "IPADDRESS", "GPU", "MODEL", "HEALTH", f"ALLOCATED/TOTAL({unit})", f"PENDING({unit})",
            "NVML USED(MiB)", "PODS"]


def wide(report: ClusterReport) -> str:
    """One row per GPU, with what the device plugin publishes about it."""
    rows = [row for node in report.nodes for row in _wide_rows(report, node)]
    lines = [_table(rows, _wide_headers(report)), RULE, *_cluster_footer(report)]
    if any(n.pending for n in report.nodes):
        lines.append(PENDING_NOTE)
    return "\n".join(lines + _notes(report)) + "\n"


def _node_detail(report: ClusterReport, node: NodeReport, with_gpus: bool) -> list[str]:
    scale = report.scale(node)
    indices = [g.index for g in node.gpus]
    show_pending = node.pending > 0
    headers = ["NAME", "NAMESPACE", *(f"GPU{i}(Allocated)" for i in indices)]
    if show_pending:
        headers.append(PENDING_HEADER)
    rows = []
    for pod in node.pods:
        row = [pod.name, pod.namespace, *(str(pod.by_gpu.get(i, 0) * scale) for i in indices)]
        if show_pending:
            row.append("0" if pod.assigned else str(pod.total * scale))
        rows.append(row)
    lines = [f"NAME:       {node.name}", f"IPADDRESS:  {node.address}", ""]
    if with_gpus:
        lines += [_table(_wide_rows(report, node), _wide_headers(report)), ""]
    lines.append(_table(rows, headers) if rows else "No pods hold GPU memory on this node.")
    allocated, total = node.allocated * scale, node.total * scale
    lines += [f"Allocated :  {allocated} ({percent(allocated, total)}%)", f"Total :      {total}", RULE]
    return lines


def details(report: ClusterReport, with_gpus: bool = False) -> str:
    """Aliyun's ``-d`` view: per node, the pods holding memory on each GPU."""
    lines: list[str] = []
    for node in report.nodes:
        lines += _node_detail(report, node, with_gpus)
    lines += ["", *_cluster_footer(report)]
    if any(n.pending for n in report.nodes):
        lines.append(PENDING_NOTE)
    return "\n".join(lines + _notes(report)) + "\n"


def as_data(report: ClusterReport) -> dict[str, Any]:
    """Structured view; the node/dev/pod keys follow the extender's ``/inspect`` reply, in the report's unit."""
    nodes = []
    for node in report.nodes:
        scale = report.scale(node)
        devs = [{"id": g.index, "model": g.model, "healthy": g.healthy, "totalGPU": g.total * scale,
                 "usedGPU": g.allocated * scale, "pendingGPU": g.pending * scale, "nvmlUsedMiB": g.nvml_used_mib,
                 "pods": [{"name": p.name, "namespace": p.namespace, "usedGPU": p.by_gpu[g.index] * scale,
                           "assigned": p.assigned} for p in node.pods if g.index in p.by_gpu]}
                for g in node.gpus]
        nodes.append({"name": node.name, "ip": node.address, "totalGPU": node.total * scale,
                      "usedGPU": node.allocated * scale, "pendingGPU": node.pending * scale, "devs": devs,
                      "unplacedPods": list(node.unplaced)})
    return {"unit": report.unit.value, "totalGPU": report.total, "usedGPU": report.allocated, "nodes": nodes}


def as_json(report: ClusterReport) -> str:
    return json.dumps(as_data(report), indent=2) + "\n"


def as_yaml(report: ClusterReport) -> str:
    return str(yaml.safe_dump(as_data(report), sort_keys=False))
