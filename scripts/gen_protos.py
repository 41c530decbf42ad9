"""Generate deviceplugin/_proto from protos/*.proto with grpcio-tools (placeholder until the protos land)."""

from __future__ import annotations

from pathlib import Path


def generate(root: Path) -> list[Path]:
    return []
