"""constraints.txt, the lock every install uses, against pyproject.toml: scripts/check_lock.py as CI runs it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIX = "run bash scripts/lock.sh and commit constraints.txt."


def check_lock(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "check_lock.py"), *args], capture_output=True,
                          text=True, timeout=60, check=False)


def copies(tmp_path: Path, pyproject: str | None = None, lock: str | None = None) -> list[str]:
    """--pyproject and --lock arguments for copies of the real files, with the given replacements."""
    (tmp_path / "pyproject.toml").write_text(pyproject or (ROOT / "pyproject.toml").read_text())
    (tmp_path / "constraints.txt").write_text(lock or (ROOT / "constraints.txt").read_text())
    return ["--pyproject", str(tmp_path / "pyproject.toml"), "--lock", str(tmp_path / "constraints.txt")]


def test_the_committed_lock_is_current() -> None:
    result = check_lock()
    assert result.returncode == 0, result.stderr
    assert "pins every requirement" in result.stdout


def test_a_pin_outside_the_range_is_named_with_the_fix(tmp_path: Path) -> None:
    lock = re.sub(r"^typer==.*$", "typer==0.29.2", (ROOT / "constraints.txt").read_text(), flags=re.MULTILINE)
    result = check_lock(*copies(tmp_path, lock=lock))
    assert result.returncode == 1
    assert ("constraints.txt pins typer==0.29.2, outside the range <0.29,>=0.12 that [project].dependencies of "
            f"pyproject.toml asks for; {FIX}") in result.stderr


def test_a_new_requirement_missing_from_the_lock_is_named(tmp_path: Path) -> None:
    pyproject = (ROOT / "pyproject.toml").read_text().replace('"rich>=13",', '"rich>=13",\n  "left-pad>=1",')
    result = check_lock(*copies(tmp_path, pyproject=pyproject))
    assert result.returncode == 1
    assert (f"left-pad is required by the 'dev' extra of pyproject.toml (left-pad>=1) but constraints.txt does not "
            f"pin it; {FIX}") in result.stderr


def test_build_requirements_are_checked_too(tmp_path: Path) -> None:
    pyproject = (ROOT / "pyproject.toml").read_text().replace('"hatchling>=1.25", "grpcio-tools>=1.66"',
                                                             '"hatchling>=99", "grpcio-tools>=1.66"')
    result = check_lock(*copies(tmp_path, pyproject=pyproject))
    assert result.returncode == 1
    assert "outside the range >=99 that [build-system].requires of pyproject.toml asks for" in result.stderr


def test_markers_that_do_not_apply_here_need_no_pin(tmp_path: Path) -> None:
    pyproject = (ROOT / "pyproject.toml").read_text().replace(
        '"rich>=13",', '"rich>=13",\n  "pywin32>=300; sys_platform == \'win32\'",')
    assert sys.platform != "win32"
    result = check_lock(*copies(tmp_path, pyproject=pyproject))
    assert result.returncode == 0, result.stderr


def test_a_range_in_the_lock_is_not_a_pin(tmp_path: Path) -> None:
    lock = re.sub(r"^fastapi==.*$", "fastapi>=0.115", (ROOT / "constraints.txt").read_text(), flags=re.MULTILINE)
    result = check_lock(*copies(tmp_path, lock=lock))
    assert result.returncode == 1
    assert "'fastapi>=0.115', is not an exact pin (name==version)" in result.stderr
