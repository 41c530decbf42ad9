"""The Dockerfile, checked without Docker: stages, pinned base, non-root user, and that what its builder stage
copies is enough to build the wheel that provides every entry point the image and the chart use."""

from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
IGNORED = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
           if line.strip() and not line.startswith("#")]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
ENTRY_POINTS = {"gpushare-extender", "gpushare-device-plugin", "kubectl-inspect-gpushare", "gpushare"}


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE)
    pairs = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            pairs.append((word.upper(), rest.strip()))
    return pairs


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for word, rest in instructions():
        if word == "FROM":
            result.append([])
        if result:
            result[-1].append((word, rest))
    return result


def base_image() -> str:
    args = dict(rest.split("=", 1) for word, rest in instructions() if word == "ARG" and "=" in rest)
    return args["PYTHON_IMAGE"]


def copies() -> list[list[str]]:
    """Source paths of every COPY that reads the build context."""
    return [rest.split()[:-1] for word, rest in instructions() if word == "COPY" and "--from=" not in rest]


def test_multi_stage_build() -> None:
    froms = [rest for word, rest in instructions() if word == "FROM"]
    assert len(froms) == 2
    assert froms[0].endswith(" AS builder")
    assert any("--from=builder" in rest for word, rest in stages()[-1] if word == "COPY")


def test_base_image_is_a_pinned_slim_python() -> None:
    image = base_image()
    assert re.fullmatch(r"python:3\.1[1-9](\.\d+)?-slim-(bookworm|trixie)(@sha256:[0-9a-f]{64})?", image), image
    assert all(rest.split()[0] == "${PYTHON_IMAGE}" for word, rest in instructions() if word == "FROM")


def test_final_stage_runs_as_non_root() -> None:
    users = [rest for word, rest in stages()[-1] if word == "USER"]
    assert users, "the final stage sets no USER, so it runs as root"
    user = users[-1].split(":")[0]
    assert user not in ("0", "root")


def test_image_entry_points_exist_in_pyproject() -> None:
    assert set(SCRIPTS) >= ENTRY_POINTS
    cmd = next(rest for word, rest in stages()[-1] if word == "CMD")
    assert cmd.split('"')[1] in SCRIPTS
    chart = (ROOT / "charts" / "gpushare" / "templates")
    commands = set(re.findall(r'command: \["([a-z-]+)"\]', "".join(p.read_text() for p in chart.glob("*.yaml"))))
    assert commands == {"gpushare-extender", "gpushare-device-plugin"}
    assert commands <= set(SCRIPTS)


def ignored(path: str) -> bool:
    return any(fnmatch.fnmatch(path, pattern) or path.startswith(pattern.rstrip("/") + "/") for pattern in IGNORED)


def test_copy_sources_exist_and_are_not_ignored() -> None:
    for sources in copies():
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
            assert not ignored(source.rstrip("/")), f"COPY {source} is excluded by .dockerignore"


@pytest.mark.parametrize("path", [".venv", ".venv-helm", ".git", "build", "tests",
                                  "gpushare/kubeletapi/deviceplugin_v1beta1_pb2.py"])
def test_dockerignore_keeps_local_state_out(path: str) -> None:
    assert ignored(path)


def test_builder_stage_files_build_every_entry_point(tmp_path: Path) -> None:
    """Stage exactly what the builder COPYs (minus .dockerignore) and build the wheel from it, as `pip install .`
    does; build isolation is off so no network is needed (the dev venv has hatchling and grpcio-tools)."""
    context = tmp_path / "context"
    for sources in copies():
        for source in sources:
            origin = ROOT / source
            target = context / source
            if origin.is_dir():
                shutil.copytree(origin, target, ignore=lambda d, names: [
                    n for n in names if ignored(str((Path(d) / n).relative_to(ROOT)))])
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, target)
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                             "-w", str(tmp_path / "dist"), str(context)], capture_output=True, text=True,
                            timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    [wheel] = (tmp_path / "dist").glob("gpushare-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = next(archive.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert "gpushare/kubeletapi/deviceplugin_v1beta1_pb2.py" in names
    for script in ENTRY_POINTS:
        assert re.search(rf"^{re.escape(script)} = ", entry_points, re.MULTILINE), script


def test_builder_installs_the_locked_versions() -> None:
    """The image gets what the tests passed with: constraints.txt for the dependencies and the package build."""
    assert any("constraints.txt" in sources for sources in copies())
    runs = " ".join(rest for word, rest in stages()[0] if word == "RUN")
    installs = re.findall(r"pip install ([^&]*)", runs)
    assert installs and all("-c constraints.txt" in args for args in installs), installs
    assert "--build-constraint constraints.txt ." in installs[-1]
