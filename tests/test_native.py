"""The placement hot path runs compiled (mypyc, scripts/hatch_build.py), and never from a stale build."""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from gpushare import native

ROOT = Path(__file__).resolve().parents[1]
COMPILED = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["hooks"]["custom"][
    "compiled"]


def test_the_installed_policies_run_compiled() -> None:
    """What scripts/test.sh installed: each module pyproject.toml lists was compiled and is imported compiled."""
    modules = [source.removesuffix(".py").replace("/", ".") for source in COMPILED]
    for module in modules:
        importlib.import_module(module)
    missing = sorted(set(modules) - set(native.compiled()))
    assert not missing, (f"{missing} run as Python: the install did not compile them (is gcc installed?); "
                         "reinstall with .venv/bin/pip install -e '.[dev]' and read its warning")


def write_package(root: Path, sources: dict[str, str]) -> None:
    for module, text in sources.items():
        path = root / (module.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_source_edited_or_deleted_since_it_was_compiled_is_stale(tmp_path: Path) -> None:
    write_package(tmp_path, {"pkg.kept": "A = 1\n", "pkg.edited": "B = 1\n", "pkg.deleted": "C = 1\n"})
    record = tmp_path / "native.json"
    native.write_record(record, tmp_path, ["pkg.kept", "pkg.edited", "pkg.deleted"])
    assert native.stale_modules(record, tmp_path) == []
    write_package(tmp_path, {"pkg.edited": "B = 2\n"})
    (tmp_path / "pkg" / "deleted.py").unlink()
    assert native.stale_modules(record, tmp_path) == ["pkg.deleted", "pkg.edited"]


def test_without_a_record_nothing_was_compiled_in_place(tmp_path: Path) -> None:
    """A wheel's install, or an editable one without a compiler: the extensions, if any, came with the wheel."""
    assert native.stale_modules(tmp_path / "native.json", tmp_path) == []


def test_a_stale_build_stops_the_import_with_the_fix(tmp_path: Path) -> None:
    """A copy of the package whose record says one compiled source was different: importing gpushare refuses."""
    shutil.copytree(ROOT / "gpushare", tmp_path / "gpushare", ignore=shutil.ignore_patterns("__pycache__"))
    record = tmp_path / "gpushare" / "native.json"
    native.write_record(record, tmp_path, ["gpushare.policies.fgd", "gpushare.model"])
    fresh = subprocess.run([sys.executable, "-c", "import gpushare"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=60, check=False)
    assert fresh.returncode == 0, fresh.stderr
    (tmp_path / "gpushare" / "policies" / "fgd.py").write_text("# edited\n")
    stale = subprocess.run([sys.executable, "-c", "import gpushare"], cwd=tmp_path, capture_output=True, text=True,
                           timeout=60, check=False)
    assert stale.returncode == 1
    assert re.search(r"ImportError: gpushare\.policies\.fgd changed since .*pip install -e", stale.stderr), stale.stderr
