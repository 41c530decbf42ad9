#!/usr/bin/env bash
# Install gpushare with its dev tools into .venv, then run every check CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# Every install takes the exact versions in constraints.txt (refresh it with bash scripts/lock.sh). The pinned pip
# comes first: the isolated build of the package (hatchling, grpcio-tools) only follows --build-constraint, which
# needs pip >= 25.3; neither -c nor PIP_CONSTRAINT reaches it any more.
.venv/bin/python -m pip install -q --upgrade -c constraints.txt pip packaging
echo "== lock";          .venv/bin/python scripts/check_lock.py
.venv/bin/python -m pip install -q -c constraints.txt --build-constraint constraints.txt -e '.[dev]'
echo "== ruff";          .venv/bin/ruff check .
echo "== mypy --strict"; .venv/bin/mypy gpushare extender deviceplugin inspect_cli
echo "== import-linter"; .venv/bin/lint-imports
echo "== pytest";        .venv/bin/pytest -q "$@"
