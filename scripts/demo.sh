#!/usr/bin/env bash
# Install gpushare into .venv and run the demo: local cluster, extender, device plugins, scheduler loop,
# simulated kubelets and GPUs, then `kubectl inspect gpushare`.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# The exact versions in constraints.txt, for the package build too (see scripts/test.sh).
.venv/bin/python -m pip install -q --upgrade -c constraints.txt pip
.venv/bin/python -m pip install -q -c constraints.txt --build-constraint constraints.txt -e '.[demo]'
exec .venv/bin/gpushare demo "$@"
