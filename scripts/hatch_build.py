"""Hatch build hook: generate the gRPC Python code from protos/, and compile the placement hot path with mypyc.

The modules listed as ``compiled`` under ``[tool.hatch.build.hooks.custom]`` in pyproject.toml (those a filter,
prioritize and bind spend their time in) are compiled to C extensions with mypyc: a wheel carries them beside their
sources, and an editable install builds them in place, where Python imports them before the ``.py`` files, and
records the hash of each source it compiled (``gpushare/native.py`` refuses to run stale ones). Without a C
compiler the build goes on without them, and says so: the same code then runs as Python, a third slower.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

# The shared library of the compiled modules, inside the package (mypyc names it after the group).
GROUP = "gpushare.native"


class BuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"
    # The compiled extensions a wheel's build includes, until the wheel is written (``finalize``).
    _stored: Path | None = None

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        sys.path.insert(0, str(root / "scripts"))
        try:
            from gen_protos import generate
        finally:
            sys.path.pop(0)
        generate(root)
        # The generated modules are gitignored; artifacts puts them in the wheel all the same.
        build_data.setdefault("artifacts", []).extend(["gpushare/kubeletapi/*.py", "gpushare/kubeletapi/*.pyi"])

        sources = list(self.config.get("compiled", []))
        editable = version == "editable"
        native = _native(root)
        if editable:
            _remove_in_place(root, sources)
            native.RECORD.unlink(missing_ok=True)
        if not sources:
            return
        with tempfile.TemporaryDirectory(prefix="gpushare-mypyc-") as scratch:
            try:
                built = _compile(root, sources, Path(scratch))
            except Exception as exc:  # a missing compiler, or headers: the code runs as Python instead
                warnings.warn(f"mypyc could not compile {', '.join(sources)} ({exc}); gpushare's placement policies "
                              "will run as Python, about a third slower. Install a C compiler (gcc) and the "
                              "Python headers, then install gpushare again.", stacklevel=1)
                return
            if editable:  # in place, where Python finds them before the sources
                for path, relative in built:
                    (root / relative).write_bytes(path.read_bytes())
                    (root / relative).chmod(0o755)
                native.write_record(native.RECORD, root, map(_module, sources))
                return
            # A wheel: the extensions go in beside their sources, and the wheel is tagged for this platform.
            build_data["pure_python"] = False
            build_data["infer_tag"] = True
            force_include = build_data.setdefault("force_include", {})
            stored = self._stored = Path(tempfile.mkdtemp(prefix="gpushare-native-"))
            for path, relative in built:
                kept = stored / relative
                kept.parent.mkdir(parents=True, exist_ok=True)
                kept.write_bytes(path.read_bytes())
                force_include[str(kept)] = relative

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        if self._stored is not None:
            shutil.rmtree(self._stored, ignore_errors=True)
            self._stored = None


def _compile(root: Path, sources: list[str], scratch: Path) -> list[tuple[Path, str]]:
    """Compile ``sources`` (paths from ``root``) into one group under ``scratch``; each extension built, with its
    path in the package."""
    from mypyc.build import mypycify
    from setuptools import Distribution

    cwd = os.getcwd()
    os.chdir(root)  # mypyc names each module after its path from the working directory
    try:
        # The build environment holds none of gpushare's own dependencies: what they type is Any here (CI checks
        # the sources with mypy --strict against them).
        extensions = mypycify(["--ignore-missing-imports", "--follow-imports=silent", "--config-file=", *sources],
                              opt_level="3", group_name=GROUP, target_dir=str(scratch / "c"))
        distribution = Distribution({"name": "gpushare", "ext_modules": extensions})
        command = distribution.get_command_obj("build_ext")
        lib = scratch / "lib"
        command.build_lib = str(lib)
        command.build_temp = str(scratch / "temp")
        command.ensure_finalized()
        command.run()
        outputs = [Path(path) for path in command.get_outputs()]
    finally:
        os.chdir(cwd)
    return [(path, path.relative_to(lib).as_posix()) for path in outputs]


def _remove_in_place(root: Path, sources: list[str]) -> None:
    """Drop what an earlier editable build left in the source tree, so that nothing stale outlives this build."""
    for pattern in ("gpushare/native__mypyc.*", *(str(Path(s).with_suffix(".*.so")) for s in sources)):
        for path in root.glob(pattern):
            path.unlink()


def _module(source: str) -> str:
    return str(Path(source).with_suffix("")).replace("/", ".")


def _native(root: Path) -> ModuleType:
    """gpushare/native.py alone, which owns the record of what was compiled: importing the package would check the
    very record this build replaces."""
    spec = importlib.util.spec_from_file_location("gpushare_native_build", root / "gpushare" / "native.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
