"""The Dockerfile, checked without Docker: stages, a base pinned by digest, hash-checked installs, no pip in the
final image, OCI labels, non-root user, and that what its builder stage copies is enough to build the wheel that
provides every entry point the image and the chart use."""

from __future__ import annotations

import fnmatch
import re
import shlex
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
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
SCRIPTS = PROJECT["scripts"]
BASE = "${PYTHON_IMAGE}${PYTHON_DIGEST:+@}${PYTHON_DIGEST}"
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


def global_args() -> dict[str, str]:
    """The ARGs declared before the first FROM, with their defaults."""
    args = {}
    for word, rest in instructions():
        if word == "FROM":
            return args
        if word == "ARG":
            name, _, default = rest.partition("=")
            args[name] = default
    return args


def expand(text: str, args: dict[str, str]) -> str:
    """Docker's ${NAME} and ${NAME:+word} substitution, the two forms the FROM lines use."""
    def one(match: re.Match[str]) -> str:
        value = args.get(match["name"], "")
        return (match["word"] if value else "") if match["plus"] else value
    return re.sub(r"\$\{(?P<name>\w+)(?P<plus>:\+(?P<word>[^}]*))?\}", one, text)


def base_image() -> str:
    return global_args()["PYTHON_IMAGE"]


def copies() -> list[list[str]]:
    """Source paths of every COPY that reads the build context."""
    return [rest.split()[:-1] for word, rest in instructions() if word == "COPY" and "--from=" not in rest]


def test_multi_stage_build() -> None:
    froms = [rest for word, rest in instructions() if word == "FROM"]
    assert len(froms) == 2
    assert froms[0].endswith(" AS builder")
    assert any("--from=builder" in rest for word, rest in stages()[-1] if word == "COPY")


def test_base_image_is_a_slim_python_pinned_by_the_digest_argument() -> None:
    image = base_image()
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim-(bookworm|trixie)", image), image
    assert global_args()["PYTHON_DIGEST"] == "", "the digest is a build argument, documented in docs/install.md"
    assert all(rest.split()[0] == BASE for word, rest in instructions() if word == "FROM")
    digest = "sha256:" + "ab" * 32
    assert expand(BASE, {"PYTHON_IMAGE": image, "PYTHON_DIGEST": digest}) == f"{image}@{digest}"
    # Without the argument the tag alone, not a dangling "@" that no registry resolves.
    assert expand(BASE, {"PYTHON_IMAGE": image, "PYTHON_DIGEST": ""}) == image
    # The digest the docs tell the operator to look up is the one of the image the Dockerfile names.
    assert f"docker buildx imagetools inspect {image} " in (ROOT / "docs" / "install.md").read_text()


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
                                  "gpushare/kubeletapi/deviceplugin_v1beta1_pb2.py",
                                  "gpushare/policies/fgd.cpython-311-x86_64-linux-gnu.so", "gpushare/native.json"])
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
    # The placement hot path, compiled (pyproject.toml lists it), with the shared library of the group.
    compiled = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["hooks"]["custom"][
        "compiled"]
    for source in [*compiled, "gpushare/native__mypyc.py"]:
        stem = source.removesuffix(".py")
        assert any(n.startswith(f"{stem}.") and n.endswith(".so") for n in names), f"{source} is not compiled"
    assert not any(n.endswith("native.json") for n in names)
    for script in ENTRY_POINTS:
        assert re.search(rf"^{re.escape(script)} = ", entry_points, re.MULTILINE), script


def pip_commands(stage: list[tuple[str, str]]) -> list[str]:
    """Every pip command the stage's RUNs chain, from the pip executable to the next &&."""
    runs = " && ".join(rest for word, rest in stage if word == "RUN")
    return [command.strip() for command in runs.split("&&") if re.search(r"\bpip\b", command)]


def test_builder_installs_only_hash_checked_wheels() -> None:
    """Every file pip installs has a sha256 from requirements-image.txt or requirements-build.txt (both generated
    from constraints.txt; tests/test_lock.py checks they match it), except the gpushare wheel built in place."""
    assert ["requirements-build.txt", "requirements-image.txt"] in copies()
    installs = [c for c in pip_commands(stages()[0]) if " install " in f" {c} "]
    hashed = [c for c in installs if "--require-hashes" in c]
    assert {c.split(" -r ")[-1] for c in hashed} == {"requirements-build.txt", "requirements-image.txt"}
    assert all("--no-deps" in c and "--only-binary=:all:" in c for c in hashed), hashed
    [local] = [c for c in installs if c not in hashed]
    assert local.endswith("--no-deps /tmp/dist/gpushare-*.whl"), local
    [build] = [c for c in pip_commands(stages()[0]) if " wheel " in c]
    # Built by the hash-checked build tools in /opt/build, not by an isolated environment pip fills unchecked.
    assert build.startswith("/opt/build/bin/pip wheel") and "--no-build-isolation" in build, build


def test_final_stage_holds_the_runtime_without_pip() -> None:
    builder_runs = " ".join(rest for word, rest in stages()[0] if word == "RUN")
    assert "python -m venv --without-pip /opt/gpushare" in builder_runs
    # Packages reach the runtime venv only through the build venv's pip, pointed at it with --python.
    assert all("/opt/gpushare" not in c or "--python /opt/gpushare/bin/python" in c
               for c in pip_commands(stages()[0]) if " install " in c)
    final = stages()[-1]
    assert [rest for word, rest in final if word == "COPY"] == ["--from=builder /opt/gpushare /opt/gpushare"]
    assert pip_commands(final) == ["python -m pip uninstall -q -y pip setuptools wheel"], \
        "the final stage may only remove the base image's pip, setuptools and wheel"


def labels() -> dict[str, str]:
    found: dict[str, str] = {}
    for word, rest in stages()[-1]:
        if word == "LABEL":
            found.update(pair.split("=", 1) for pair in shlex.split(rest))
    return found


def test_final_stage_carries_the_oci_labels() -> None:
    final_args = {rest.partition("=")[0]: rest.partition("=")[2] for word, rest in stages()[-1] if word == "ARG"}
    found = labels()
    assert found["org.opencontainers.image.title"] == PROJECT["name"]
    assert found["org.opencontainers.image.licenses"] == PROJECT["license"]
    assert found["org.opencontainers.image.description"]
    assert found["org.opencontainers.image.source"] == "${SOURCE}" and final_args["SOURCE"].startswith("https://")
    assert found["org.opencontainers.image.version"] == "${VERSION}" and final_args["VERSION"] == PROJECT["version"]
    # What differs per build comes from build arguments, declared in the stage that uses them.
    assert found["org.opencontainers.image.revision"] == "${REVISION}" and "REVISION" in final_args
    assert found["org.opencontainers.image.created"] == "${CREATED}" and "CREATED" in final_args
    assert found["org.opencontainers.image.base.digest"] == "${PYTHON_DIGEST}" and "PYTHON_DIGEST" in final_args
