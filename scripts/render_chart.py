"""Lint and render a Helm chart offline with Helm's own Go engine (the helm-python-sdk binding of Helm v4).

Runs in the chart tool venv that scripts/check_chart.sh builds, not in the project's venv. For each values file
it writes OUT/<name>/<template>.yaml (one file per template that renders to something), or OUT/<name>/FAILED
with Helm's message when linting or rendering fails.

    render_chart.py CHART OUT VALUES.yaml...      exit 1 if any values file failed
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml
from helm_python import HelmError, chart

RELEASE = "gpushare"
NAMESPACE = "kube-system"
LINT_KUBE_VERSION = "v1.30.0"
WARNING = 2


def render(chart_dir: Path, values_file: Path, out: Path) -> str | None:
    """Lint (strict) and render one values file; the failure message, or ``None`` on success."""
    values = yaml.safe_load(values_file.read_text()) or {}
    report = chart.lint(str(chart_dir), values, strict=True, namespace=NAMESPACE, kube_version=LINT_KUBE_VERSION)
    problems = [f"{m['path']}: {m['error']}" for m in report.get("messages", []) if m["severity"] >= WARNING]
    problems += [str(e) for e in report.get("errors") or []]
    if problems:
        return "helm lint: " + "; ".join(problems)
    try:
        manifests = chart.Chart.load(str(chart_dir)).render(values, name=RELEASE, namespace=NAMESPACE,
                                                             is_install=True)
    except HelmError as exc:
        return f"helm render: {exc}"
    for template, text in sorted(manifests.items()):
        if template.endswith(".yaml") and text.strip():
            (out / Path(template).name).write_text(text)
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chart", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("values", type=Path, nargs="+")
    args = parser.parse_args()
    failed = 0
    for values_file in args.values:
        name = values_file.name.removesuffix(".yaml").removesuffix("-values")
        target = args.out / name
        target.mkdir(parents=True, exist_ok=True)
        message = render(args.chart, values_file, target)
        if message is None:
            print(f"rendered {name}: {len(list(target.glob('*.yaml')))} manifests in {target}")
        else:
            failed += 1
            (target / "FAILED").write_text(message + "\n")
            print(f"FAILED {name}: {message}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
