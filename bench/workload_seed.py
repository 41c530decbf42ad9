"""Derive a workload seed file (task shapes and weights) from an openb trace.

    python -m bench.workload_seed [--trace default] [--data DIR] --out seed.yaml

The extender's learning policies (fgd, fgd-lookahead, fgd-scarcity) can start from such a file instead of an empty
histogram. Shapes are those of ``gpushare.policies.workload.Shape``: GPU count, per-GPU share in memory
units (gpu_milli for the trace, every GPU being 1000 units), CPU and accepted models.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from bench import openb
from gpushare.policies.workload import count_shapes, dump_workload


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=openb.DEFAULT_DATA, help="folder with the openb CSV files")
    parser.add_argument("--trace", choices=sorted(openb.TRACES), default="default")
    parser.add_argument("--out", type=Path, required=True, help="YAML file to write")
    args = parser.parse_args(argv)
    try:
        pods = openb.load_pods(args.data, args.trace)
    except openb.TraceError as exc:
        print(exc, file=sys.stderr)
        return 2
    args.out.write_text(dump_workload(count_shapes(p.request() for p in pods)))
    print(f"{len(pods)} pods of the {args.trace} trace -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
