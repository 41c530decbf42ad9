"""The chart's alerting rules held against what each component's /metrics really exports: a renamed series or
label value would leave its alert silent forever, and nothing else would notice."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

# Rendered by scripts/check_chart.sh from charts/gpushare/ci/ha-tls-monitoring-values.yaml, with the operator's API.
MONITORING_SCENARIO = "ha-tls-monitoring"


def alert_rules(chart_out: Path, group: str) -> list[dict[str, Any]]:
    """The rules of ``group`` in the PrometheusRule of the monitoring scenario."""
    docs = yaml.safe_load_all((chart_out / MONITORING_SCENARIO / "monitoring.yaml").read_text())
    [rule] = [doc for doc in docs if doc and doc["kind"] == "PrometheusRule"]
    [found] = [g["rules"] for g in rule["spec"]["groups"] if g["name"] == group]
    rules: list[dict[str, Any]] = found
    return rules


def series_read(expr: str) -> list[tuple[str, str]]:
    """The gpushare series a rule's PromQL expression reads, each with its selector's text."""
    return re.findall(r"\b(gpushare_\w+)\{([^}]*)\}", expr)


def unexported_reads(rules: list[dict[str, Any]], metrics_text: str) -> list[str]:
    """Each series, or label value of a selector, that the rules read and ``metrics_text`` never exports
    (``namespace`` aside: Prometheus adds it when scraping)."""
    exported: dict[str, set[tuple[str, str]]] = {}
    for line in metrics_text.splitlines():
        if match := re.match(r"(\w+)(?:\{(.*)\})? ", line):
            exported.setdefault(match[1], set()).update(re.findall(r'(\w+)="([^"]*)"', match[2] or ""))
    missing = []
    for rule in rules:
        reads = series_read(rule["expr"])
        if not reads:
            missing.append(f"{rule['alert']} reads no gpushare series")
        for name, selector in reads:
            if name not in exported:
                missing.append(f"{rule['alert']}: {name}")
                continue
            for label, operator, values in re.findall(r'(\w+)(=~|=)"([^"]*)"', selector):
                for value in values.split("|") if operator == "=~" else [values]:
                    if label != "namespace" and (label, value) not in exported[name]:
                        missing.append(f'{rule["alert"]}: {name}{{{label}="{value}"}}')
    return missing
