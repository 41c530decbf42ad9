"""Hatch build hook: generate the gRPC Python code from protos/ at build and install time."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class ProtoBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        sys.path.insert(0, str(Path(self.root) / "scripts"))
        try:
            from gen_protos import generate
        finally:
            sys.path.pop(0)
        generate(Path(self.root))
        # The generated modules are gitignored; artifacts puts them in the wheel all the same.
        build_data.setdefault("artifacts", []).extend(["gpushare/kubeletapi/*.py", "gpushare/kubeletapi/*.pyi"])
