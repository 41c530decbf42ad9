"""Check that constraints.txt still pins what pyproject.toml asks for.

Every requirement of ``[project].dependencies``, of each ``[project.optional-dependencies]`` extra and of
``[build-system].requires`` (where its marker applies to this interpreter) must be pinned with ``==`` in the lock,
at a version inside the requirement's range. requirements-image.txt and requirements-build.txt, the Dockerfile's
hash-checked installs, must pin exactly constraints.txt's versions, each with at least one --hash, and name every
requirement of [project].dependencies (respectively [build-system].requires) that applies in the image; the test
suite checks that they also hold every transitive dependency. Each stale entry is reported as one sentence with
the fix.

    python scripts/check_lock.py [--pyproject pyproject.toml] [--lock constraints.txt] [--image-dir .]

Exit status 0 when the lock is current, 1 when it is stale.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
FIX = "run bash scripts/lock.sh and commit constraints.txt"
IMAGE_FIX = ("run .venv/bin/python scripts/image_requirements.py (after installing the lock into .venv) and commit "
             "requirements-image.txt and requirements-build.txt")
IMAGE_FILES = {"requirements-image.txt": "[project].dependencies", "requirements-build.txt": "[build-system].requires"}

# The image: python:3.11-slim-trixie (glibc 2.41) on both architectures a Kubernetes GPU node runs, or -bookworm
# (glibc 2.36) where an operator builds on it. A wheel tagged for any of these platforms installs on either:
# manylinux_2_5 to _2_36 and their older aliases.
IMAGE_PLATFORMS = {arch: [f"manylinux_2_{minor}_{arch}" for minor in range(36, 4, -1)]
                   + [f"{alias}_{arch}" for alias in ("manylinux2014", "manylinux2010", "manylinux1", "linux")]
                   for arch in ("x86_64", "aarch64")}
# The marker values pip sees there, in place of this interpreter's (a lock made on macOS or 3.12 is for the image).
IMAGE_ENVIRONMENTS = [{"implementation_name": "cpython", "implementation_version": "3.11.0", "os_name": "posix",
                       "platform_machine": arch, "platform_python_implementation": "CPython",
                       "platform_release": "", "platform_system": "Linux", "platform_version": "",
                       "python_full_version": "3.11.0", "python_version": "3.11", "sys_platform": "linux"}
                      for arch in IMAGE_PLATFORMS]


def requirements(pyproject: dict[str, Any]) -> Iterator[tuple[str, str, Requirement]]:
    """(where pyproject.toml lists it, the extra or "", requirement) for every requirement the lock must cover."""
    project, build = pyproject.get("project", {}), pyproject.get("build-system", {})
    for text in project.get("dependencies", []):
        yield "[project].dependencies", "", Requirement(text)
    for extra, texts in project.get("optional-dependencies", {}).items():
        for text in texts:
            yield f"the {extra!r} extra", extra, Requirement(text)
    for text in build.get("requires", []):
        yield "[build-system].requires", "", Requirement(text)


def read_lock(lock: Path) -> tuple[dict[str, Version], list[str]]:
    """The lock's pins by canonical name, and a sentence for each line that is not an exact pin."""
    pins: dict[str, Version] = {}
    problems: list[str] = []
    for number, raw in enumerate(lock.read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            pin = Requirement(line)
        except InvalidRequirement:
            problems.append(f"{lock.name} line {number}, {line!r}, is not a requirement; {FIX}.")
            continue
        [*specs] = pin.specifier
        if len(specs) != 1 or specs[0].operator != "==" or "*" in specs[0].version:
            problems.append(f"{lock.name} line {number}, {line!r}, is not an exact pin (name==version); {FIX}.")
            continue
        pins[canonicalize_name(pin.name)] = Version(specs[0].version)
    return pins, problems


def read_hashed(path: Path) -> tuple[dict[str, tuple[Version, int]], list[str]]:
    """A hash-checked requirements file's pins by canonical name, with the number of hashes of each."""
    entries: dict[str, tuple[Version, int]] = {}
    problems: list[str] = []
    text = re.sub(r"\\\n", " ", path.read_text())
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement, *options = line.split()
        pin = Requirement(requirement)
        [*specs] = pin.specifier
        if len(specs) != 1 or specs[0].operator != "==":
            problems.append(f"{path.name} lists {requirement!r}, which is not an exact pin (name==version); "
                            f"{IMAGE_FIX}.")
            continue
        count = sum(option.startswith("--hash=sha256:") for option in options)
        entries[canonicalize_name(pin.name)] = (Version(specs[0].version), count)
    return entries, problems


def check_image(pyproject: dict[str, Any], pins: dict[str, Version], path: Path) -> list[str]:
    """requirements-image.txt or requirements-build.txt against the lock and pyproject.toml's direct requirements."""
    if not path.exists():
        return [f"{path} does not exist; {IMAGE_FIX}."]
    entries, problems = read_hashed(path)
    for name, (version, count) in sorted(entries.items()):
        if pins.get(name) != version:
            locked = f"constraints.txt pins {name}=={pins[name]}" if name in pins else "constraints.txt does not pin it"
            problems.append(f"{path.name} pins {name}=={version} but {locked}; {IMAGE_FIX}.")
        if count == 0:
            problems.append(f"{path.name} pins {name}=={version} without a --hash, so pip install --require-hashes "
                            f"refuses the whole file; {IMAGE_FIX}.")
    where = IMAGE_FILES[path.name]
    section, key = ("project", "dependencies") if where.startswith("[project]") else ("build-system", "requires")
    for text in pyproject.get(section, {}).get(key, []):
        req = Requirement(text)
        applies = req.marker is None or any(req.marker.evaluate({**env, "extra": ""}) for env in IMAGE_ENVIRONMENTS)
        if applies and canonicalize_name(req.name) not in entries:
            problems.append(f"{req.name} is required by {where} of pyproject.toml ({req}) but {path.name} does not "
                            f"list it, so the image would be built without it; {IMAGE_FIX}.")
    return problems


def check(pyproject_path: Path, lock: Path) -> list[str]:
    """Every stale entry as a sentence naming the package, the pin, the range and the fix; empty when current."""
    pyproject = tomllib.loads(pyproject_path.read_text())
    pins, problems = read_lock(lock)
    for where, extra, req in requirements(pyproject):
        # Markers are evaluated for this interpreter and platform, as pip would when installing the extra.
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        pinned = pins.get(canonicalize_name(req.name))
        if pinned is None:
            problems.append(f"{req.name} is required by {where} of {pyproject_path.name} ({req}) but "
                            f"{lock.name} does not pin it; {FIX}.")
        elif not req.specifier.contains(pinned, prereleases=True):
            problems.append(f"{lock.name} pins {req.name}=={pinned}, outside the range {req.specifier} that "
                            f"{where} of {pyproject_path.name} asks for; {FIX}.")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pyproject", type=Path, default=ROOT / "pyproject.toml")
    parser.add_argument("--lock", type=Path, default=ROOT / "constraints.txt")
    parser.add_argument("--image-dir", type=Path, default=ROOT,
                        help="the folder of requirements-image.txt and requirements-build.txt")
    args = parser.parse_args(argv)
    if not args.lock.exists():
        print(f"{args.lock} does not exist; {FIX}.", file=sys.stderr)
        return 1
    problems = check(args.pyproject, args.lock)
    pyproject = tomllib.loads(args.pyproject.read_text())
    pins = read_lock(args.lock)[0]
    for name in IMAGE_FILES:
        problems += check_image(pyproject, pins, args.image_dir / name)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 1
    print(f"{args.lock.name} pins every requirement of {args.pyproject.name} inside its range; "
          f"{', '.join(IMAGE_FILES)} pin its versions with hashes.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
