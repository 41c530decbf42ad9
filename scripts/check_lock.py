"""Check that constraints.txt still pins what pyproject.toml asks for.

Every requirement of ``[project].dependencies``, of each ``[project.optional-dependencies]`` extra and of
``[build-system].requires`` (where its marker applies to this interpreter) must be pinned with ``==`` in the lock,
at a version inside the requirement's range. Each stale entry is reported as one sentence with the fix.

    python scripts/check_lock.py [--pyproject pyproject.toml] [--lock constraints.txt]

Exit status 0 when the lock is current, 1 when it is stale.
"""

from __future__ import annotations

import argparse
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
    args = parser.parse_args(argv)
    if not args.lock.exists():
        print(f"{args.lock} does not exist; {FIX}.", file=sys.stderr)
        return 1
    problems = check(args.pyproject, args.lock)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 1
    print(f"{args.lock.name} pins every requirement of {args.pyproject.name} inside its range.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
