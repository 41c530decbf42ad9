"""Generate gpushare/kubeletapi from protos/*.proto with grpcio-tools.

The sources are copied into a temporary include tree laid out as ``gpushare/kubeletapi/<name>.proto`` so that
protoc writes package-qualified imports (``from gpushare.kubeletapi import x_pb2``) and registers each file
under that path. Output is written only where it changed, so a rebuild leaves untouched files alone.

Usage: ``python scripts/gen_protos.py [OUT_DIR]`` (default: the repository's gpushare/kubeletapi).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

PACKAGE = Path("gpushare") / "kubeletapi"


def generate(root: Path, out_dir: Path | None = None) -> list[Path]:
    """Compile every ``root/protos/*.proto`` into ``out_dir``; return the generated files."""
    from grpc_tools import protoc

    sources = sorted((root / "protos").glob("*.proto"))
    if not sources:
        raise RuntimeError(f"No .proto files found in {root / 'protos'}; the checkout is incomplete.")
    target = out_dir or root / PACKAGE
    with tempfile.TemporaryDirectory() as tmp:
        include = Path(tmp) / "include"
        built = Path(tmp) / "out"
        (include / PACKAGE).mkdir(parents=True)
        built.mkdir()
        for source in sources:
            shutil.copyfile(source, include / PACKAGE / source.name)
        args = ["grpc_tools.protoc", f"-I{include}", f"--python_out={built}", f"--pyi_out={built}",
                f"--grpc_python_out={built}", *(str(PACKAGE / s.name) for s in sources)]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {', '.join(s.name for s in sources)}; see its message above.")
        target.mkdir(parents=True, exist_ok=True)
        written = []
        for produced in sorted((built / PACKAGE).iterdir()):
            destination = target / produced.name
            data = produced.read_bytes()
            if not destination.exists() or destination.read_bytes() != data:
                destination.write_bytes(data)
            written.append(destination)
    return written


if __name__ == "__main__":
    repo = Path(__file__).resolve().parent.parent
    for path in generate(repo, Path(sys.argv[1]) if len(sys.argv) > 1 else None):
        print(path)
