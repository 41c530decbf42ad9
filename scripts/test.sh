#!/usr/bin/env bash
# Install gpushare with its dev tools into .venv, then run every check CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev]'
echo "== ruff";          .venv/bin/ruff check .
echo "== mypy --strict"; .venv/bin/mypy gpushare extender deviceplugin inspect_cli
echo "== import-linter"; .venv/bin/lint-imports
echo "== pytest";        .venv/bin/pytest -q "$@"
