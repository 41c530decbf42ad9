"""Lint and render a Helm chart offline with Helm's own Go engine (the helm-python-sdk binding of Helm v4).

Runs in the chart tool venv that scripts/check_chart.sh builds, not in the project's venv. For each values file
it writes OUT/<name>/<template>.yaml (one file per template that renders to something) and OUT/<name>/NOTES.txt,
or OUT/<name>/FAILED with Helm's message when linting or rendering fails. --api-versions adds API versions to the
offline cluster's capabilities, as helm template --api-versions does (for .Capabilities.APIVersions.Has).

    render_chart.py [--api-versions GROUP/VERSION]... CHART OUT VALUES.yaml...      exit 1 if any values file failed
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml
from helm_python import HelmError, _native, chart

RELEASE = "gpushare"
NAMESPACE = "kube-system"
LINT_KUBE_VERSION = "v1.30.0"
WARNING = 2


def render_with_api_versions(loaded: chart.Chart, values: dict[str, Any], api_versions: list[str]) -> dict[str, str]:
    """Chart.render, plus the extra API versions: helm-python-sdk 0.2.2's native render takes ``api_versions`` (it
    rejects unknown options, so this is checked on every call) but its Python wrapper has no parameter for it."""
    options = {"name": RELEASE, "namespace": NAMESPACE, "is_install": True, "api_versions": api_versions}
    manifests: dict[str, str] = json.loads(_native.call_string("helm_render", loaded._raw(), json.dumps(values),
                                                               json.dumps(options)))
    return manifests


def render(chart_dir: Path, values_file: Path, out: Path, api_versions: list[str]) -> str | None:
    """Lint (strict) and render one values file; the failure message, or ``None`` on success."""
    values = yaml.safe_load(values_file.read_text()) or {}
    report = chart.lint(str(chart_dir), values, strict=True, namespace=NAMESPACE, kube_version=LINT_KUBE_VERSION)
    problems = [f"{m['path']}: {m['error']}" for m in report.get("messages", []) if m["severity"] >= WARNING]
    problems += [str(e) for e in report.get("errors") or []]
    if problems:
        return "helm lint: " + "; ".join(problems)
    try:
        manifests = render_with_api_versions(chart.Chart.load(str(chart_dir)), values, api_versions)
    except HelmError as exc:
        return f"helm render: {exc}"
    for template, text in sorted(manifests.items()):
        if (template.endswith(".yaml") or template.endswith("/NOTES.txt")) and text.strip():
            (out / Path(template).name).write_text(text)
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--api-versions", action="append", default=[], metavar="GROUP/VERSION",
                        help="an API version the cluster serves besides Kubernetes' own, e.g. "
                             "monitoring.coreos.com/v1; repeat for more")
    parser.add_argument("chart", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("values", type=Path, nargs="+")
    args = parser.parse_args()
    failed = 0
    for values_file in args.values:
        name = values_file.name.removesuffix(".yaml").removesuffix("-values")
        target = args.out / name
        target.mkdir(parents=True, exist_ok=True)
        message = render(args.chart, values_file, target, args.api_versions)
        if message is None:
            print(f"rendered {name}: {len(list(target.glob('*.yaml')))} manifests in {target}")
        else:
            failed += 1
            (target / "FAILED").write_text(message + "\n")
            print(f"FAILED {name}: {message}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
