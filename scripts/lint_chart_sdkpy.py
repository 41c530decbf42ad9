"""Lint a Helm chart offline and strictly with helm-sdkpy (Helm v4's Go engine bundled as a shared library).

Runs in the venv that scripts/check_chart.sh builds for helm-sdkpy (Python >= 3.12), not in the project's venv.
helm-sdkpy's Lint takes a chart path and nothing else: its Go side runs Helm's lint with no values and without
--strict. So this script supplies both: a values file is linted as a copy of the chart whose values.yaml is that
file merged over the chart's own (what Helm's lint does with values), and a warning fails like an error, as with
`helm lint --strict`. Helm's message text does not come through helm-sdkpy (its errors reach Python as `{}`), so
a failure names the file and severity; scripts/render_chart.py lints the same values with Helm's full message.

    lint_chart_sdkpy.py CHART [VALUES.yaml...]    the chart's defaults, then each values file; exit 1 on a failure
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from helm_sdkpy import Configuration, HelmError, Lint

NAMESPACE = "kube-system"
SEVERITY = {0: "unknown", 1: "info", 2: "warning", 3: "error"}
WARNING = 2


def merged(defaults: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of user values over chart defaults: maps merge deeply, null deletes the key."""
    result = dict(defaults)
    for key, value in overrides.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = value
    return result


def lint(chart_dir: Path) -> list[str]:
    """Helm's lint findings of warning severity or worse, as "severity in path" sentences."""
    try:
        report = asyncio.run(Lint(Configuration(namespace=NAMESPACE)).run(str(chart_dir)))
    except HelmError as exc:
        return [str(exc)]
    problems = [f"{SEVERITY.get(m['Severity'], m['Severity'])} in {m['Path']}"
                for m in report.get("Messages") or [] if m["Severity"] >= WARNING]
    if report.get("TotalChartsLinted") != 1 and not problems:
        problems.append(f"Helm could not load the chart ({len(report.get('Errors') or [])} errors)")
    return problems


def lint_with_values(chart_dir: Path, values_file: Path) -> list[str]:
    defaults = yaml.safe_load((chart_dir / "values.yaml").read_text()) or {}
    overrides = yaml.safe_load(values_file.read_text()) or {}
    with tempfile.TemporaryDirectory(prefix="lint-sdkpy-") as scratch:
        copy = Path(scratch) / chart_dir.resolve().name
        shutil.copytree(chart_dir, copy)
        (copy / "values.yaml").write_text(yaml.safe_dump(merged(defaults, overrides), sort_keys=False))
        return lint(copy)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chart", type=Path)
    parser.add_argument("values", type=Path, nargs="*")
    args = parser.parse_args()
    cases = [("chart defaults", lint(args.chart))]
    cases += [(values_file.name, lint_with_values(args.chart, values_file)) for values_file in args.values]
    failed = 0
    for name, problems in cases:
        if problems:
            failed += 1
            print(f"FAILED helm-sdkpy lint --strict, {name}: {'; '.join(problems)}. For Helm's message, run "
                  f"scripts/check_chart.sh's render step (scripts/render_chart.py) on the same values.",
                  file=sys.stderr)
        else:
            print(f"linted {name}: no warnings or errors")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
