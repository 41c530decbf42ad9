"""The placement hot path runs compiled (mypyc, scripts/hatch_build.py), and never from a stale build."""

from __future__ import annotations

import hashlib
import importlib
import json
import tomllib
from pathlib import Path

import pytest

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


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_a_source_edited_since_it_was_compiled_is_stale(tmp_path: Path) -> None:
    write_package(tmp_path, {"pkg.kept": "A = 1\n", "pkg.edited": "B = 2\n"})
    record = tmp_path / "native.json"
    record.write_text(json.dumps({"pkg.kept": digest("A = 1\n"), "pkg.edited": digest("B = 1\n"),
                                  "pkg.deleted": digest("C = 1\n")}))
    assert native.stale_modules(record, tmp_path) == ["pkg.deleted", "pkg.edited"]


def test_without_a_record_nothing_was_compiled_in_place(tmp_path: Path) -> None:
    """A wheel's install, or an editable one without a compiler: the extensions, if any, came with the wheel."""
    assert native.stale_modules(tmp_path / "native.json", tmp_path) == []


def test_a_stale_build_stops_the_import_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = tmp_path / "native.json"
    record.write_text(json.dumps({"gpushare.policies.fgd": digest("what was compiled once\n")}))
    monkeypatch.setattr(native, "RECORD", record)
    with pytest.raises(ImportError, match=r"gpushare\.policies\.fgd changed since .*pip install -e"):
        native.check_fresh()
