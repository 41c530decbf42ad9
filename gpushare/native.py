"""Which of gpushare's modules run compiled, and a refusal to run compiled modules older than their source.

The build compiles the placement hot path with mypyc (scripts/hatch_build.py). An editable install builds the
extensions in place, where Python imports them instead of the ``.py`` files beside them, and records the hash of
each source it compiled: a source edited since then would otherwise go on running as it was, silently.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterable
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
RECORD = Path(__file__).with_name("native.json")


def write_record(record: Path, root: Path, modules: Iterable[str]) -> None:
    """Record the hash of each of ``modules``' source under ``root``, as an editable build has just compiled it."""
    record.write_text(json.dumps({module: _digest(_source(root, module)) for module in sorted(modules)}, indent=1)
                      + "\n")


def stale_modules(record: Path, root: Path) -> list[str]:
    """The modules in the editable build's ``record`` whose source under ``root`` is no longer what was compiled."""
    if not record.is_file():  # a wheel, or a build without a compiler: nothing compiled in place
        return []
    compiled: dict[str, str] = json.loads(record.read_text())
    return [module for module, digest in sorted(compiled.items())
            if _digest(_source(root, module)) != digest]


def check_fresh() -> None:
    """Raise ``ImportError`` when a module compiled in place no longer matches its source."""
    stale = stale_modules(RECORD, PACKAGE_ROOT)
    if stale:
        raise ImportError(f"{', '.join(stale)} changed since the editable install compiled it, and Python would go "
                          "on running the compiled copy: install again (.venv/bin/pip install -e '.[dev]', or bash "
                          "scripts/test.sh) to compile the new source.")


def compiled() -> list[str]:
    """gpushare's modules imported so far from a C extension rather than from Python source, by name."""
    return sorted(name for name, module in list(sys.modules.items())
                  if name.startswith("gpushare.") and str(getattr(module, "__file__", "")).endswith(
                      tuple(EXTENSION_SUFFIXES)))


def _source(root: Path, module: str) -> Path:
    return root / (module.replace(".", "/") + ".py")


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return ""
