"""constraints.txt, the lock every install uses, against pyproject.toml, and the Dockerfile's hash-checked
requirements-image.txt and requirements-build.txt against constraints.txt: scripts/check_lock.py as CI runs it."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
FIX = "run bash scripts/lock.sh and commit constraints.txt."
IMAGE_FIX = ("run .venv/bin/python scripts/image_requirements.py (after installing the lock into .venv) and commit "
             "requirements-image.txt and requirements-build.txt.")


def check_lock(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "check_lock.py"), *args], capture_output=True,
                          text=True, timeout=60, check=False)


def copies(tmp_path: Path, pyproject: str | None = None, lock: str | None = None, image: str | None = None
           ) -> list[str]:
    """--pyproject, --lock and --image-dir arguments for copies of the real files, with the given replacements."""
    (tmp_path / "pyproject.toml").write_text(pyproject or (ROOT / "pyproject.toml").read_text())
    (tmp_path / "constraints.txt").write_text(lock or (ROOT / "constraints.txt").read_text())
    (tmp_path / "requirements-image.txt").write_text(image or (ROOT / "requirements-image.txt").read_text())
    (tmp_path / "requirements-build.txt").write_text((ROOT / "requirements-build.txt").read_text())
    return ["--pyproject", str(tmp_path / "pyproject.toml"), "--lock", str(tmp_path / "constraints.txt"),
            "--image-dir", str(tmp_path)]


def image_requirements() -> str:
    return (ROOT / "requirements-image.txt").read_text()


def without_entry(text: str, name: str) -> str:
    """The requirements file with ``name``'s entry (its pin and hash lines) removed."""
    return re.sub(rf"^{re.escape(name)}==[^\n]*(\n +--hash[^\n]*)*\n", "", text, flags=re.MULTILINE)


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


def test_an_image_pin_that_differs_from_the_lock_is_named_with_the_fix(tmp_path: Path) -> None:
    image = image_requirements().replace("typer==0.28.0 ", "typer==0.27.0 ")
    result = check_lock(*copies(tmp_path, image=image))
    assert result.returncode == 1
    assert f"requirements-image.txt pins typer==0.27.0 but constraints.txt pins typer==0.28.0; {IMAGE_FIX}" \
        in result.stderr


def test_a_runtime_dependency_missing_from_the_image_is_named(tmp_path: Path) -> None:
    result = check_lock(*copies(tmp_path, image=without_entry(image_requirements(), "fastapi")))
    assert result.returncode == 1
    assert ("fastapi is required by [project].dependencies of pyproject.toml (fastapi>=0.115) but "
            f"requirements-image.txt does not list it, so the image would be built without it; {IMAGE_FIX}"
            ) in result.stderr


def test_an_image_pin_without_a_hash_is_refused(tmp_path: Path) -> None:
    image = re.sub(r"^(typer==0\.28\.0)( \\\n +--hash[^\n]*)+", r"\1", image_requirements(), flags=re.MULTILINE)
    result = check_lock(*copies(tmp_path, image=image))
    assert result.returncode == 1
    assert "requirements-image.txt pins typer==0.28.0 without a --hash" in result.stderr


def hashed_names(path: Path) -> set[str]:
    return {canonicalize_name(line.split("==")[0]) for line in path.read_text().splitlines() if "==" in line}


@pytest.mark.parametrize(("path", "roots"), [
    ("requirements-image.txt", "dependencies"), ("requirements-build.txt", "requires")])
def test_the_image_files_hold_exactly_the_transitive_closure(monkeypatch: pytest.MonkeyPatch, path: str,
                                                             roots: str) -> None:
    """What scripts/image_requirements.py would write from the packages installed here (the lock's), by name: a
    dependency that a new version pulls in, or one that it dropped, makes the committed file stale."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import image_requirements

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    texts = pyproject["project"]["dependencies"] if roots == "dependencies" else [
        "pip", *pyproject["build-system"]["requires"]]
    expected = image_requirements.closure(Requirement(text) for text in texts)
    listed = hashed_names(ROOT / path)
    assert not expected - listed, f"{path} misses {sorted(expected - listed)}; {IMAGE_FIX}"
    assert not listed - expected, f"{path} lists {sorted(listed - expected)}, which nothing needs; {IMAGE_FIX}"
