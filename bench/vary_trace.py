"""Write a variant of an openb pod list with shapes the published traces do not have, for the benchmarks' --trace.

    python -m bench.vary_trace --trace gpuspec20 [--data DIR] --out FILE [--seed 7]
        [--share-demand 0.8 | --multi-gpu-demand 0.5]
        [--spec-fraction 0.4 [--spec-from gpuspec20]] [--host-spread 0.5] [--share-range 50-999]
        [--cpu-only-scale 2]

The extender remembers fit answers and scores per pod shape, and the fgd policies' cost grows with the shapes
they learn, so a workload with more shapes than the traces here costs more per pod. Per pod, in this order, each
only when asked for:

- ``--share-demand F`` or ``--multi-gpu-demand F``: every GPU pod is replaced by a GPU pod of the trace drawn at
  random (every column but the name), from its pods that share a GPU (or that take several GPUs) with the
  probability that gives them F of the GPU demand, and otherwise from its other GPU pods: the family's gpushareNN
  and multigpuNN members past those published here, such as gpushare80 and multigpu50 (F = 0.8, 0.5);
- ``--spec-fraction F``: a GPU pod gets, with probability F, the GPU model constraint (``gpu_spec``) of a
  constrained pod of ``--spec-from`` drawn at random: more of the family's spec-constrained pods;
- ``--host-spread S``: its CPU and memory requests are scaled by a factor drawn from [1 - S, 1 + S]: every pod
  a CPU of its own, as in a cluster whose teams each pick their own;
- ``--share-range LO-HI``: a pod sharing a GPU (0 < gpu_milli < 1000) gets a share drawn from LO-HI of the GPU's
  1,000 units: GPU memory asked in MiB, each pod its own amount.
- ``--cpu-only-scale K``: a pod without GPUs is written K times on average (the whole part of K, and once more
  with the chance of its fraction; copies named ``<name>-c<k>``): the CPU-only work of the family's cpuNNN
  members past those published, such as cpu200 from cpu100 with K at 2 (0 leaves none).

Every other column is copied as it is. The file goes to ``--out``, never into the openb folder.
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import openb

SHARE_UNITS = openb.GPU_UNITS


def _share_range(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    try:
        bounds = int(low), int(high)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--share-range takes LO-HI, two whole numbers of a GPU's {SHARE_UNITS} "
                                         f"units such as 50-999, not {text!r}.") from None
    if not 1 <= bounds[0] <= bounds[1] < SHARE_UNITS:
        raise argparse.ArgumentTypeError(f"--share-range {text} must satisfy 1 <= LO <= HI < {SHARE_UNITS}: a share "
                                         "of a whole GPU or more is not a shared GPU.")
    return bounds


# The most copies of each CPU-only pod ``--cpu-only-scale`` writes.
MAX_CPU_ONLY_SCALE = 10


def _scale(text: str) -> float:
    value = _number(text, "--cpu-only-scale")
    if not 0 <= value <= MAX_CPU_ONLY_SCALE:
        raise argparse.ArgumentTypeError(f"--cpu-only-scale must be from 0 to {MAX_CPU_ONLY_SCALE}, not {text}.")
    return value


def _number(text: str, option: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{option} takes a number, not {text!r}.") from None


def _fraction(text: str, option: str, below_one: bool) -> float:
    value = _number(text, option)
    if not (0 <= value < 1 if below_one else 0 <= value <= 1):
        allowed = "at least 0 and below 1" if below_one else "from 0 to 1"
        raise argparse.ArgumentTypeError(f"{option} must be {allowed}, not {text}.")
    return value


def _sharing(row: dict[str, str]) -> bool:
    return 0 < int(row["gpu_milli"]) < SHARE_UNITS


def _multi_gpu(row: dict[str, str]) -> bool:
    return int(row["num_gpu"]) > 1


def _demand(row: dict[str, str]) -> int:
    return int(row["num_gpu"]) * int(row["gpu_milli"])


@dataclass(frozen=True, slots=True)
class Redraw:
    """Every GPU pod redrawn so that the pods ``kind`` picks hold ``fraction`` of the GPU demand, in expectation."""

    option: str
    kind: Callable[[dict[str, str]], bool]
    fraction: float

    def pools(self, rows: Sequence[dict[str, str]]) -> tuple[list[dict[str, str]], list[dict[str, str]], float]:
        """The trace's other GPU pods, those of the kind, and the chance of drawing from the second."""
        gpu_pods = [row for row in rows if int(row["num_gpu"]) > 0]
        others, chosen = [r for r in gpu_pods if not self.kind(r)], [r for r in gpu_pods if self.kind(r)]
        if (self.fraction > 0 and not chosen) or (self.fraction < 1 and not others):
            raise openb.TraceError(f"{self.option} draws from the trace's GPU pods of both kinds, and it has none of "
                                   "one: pass a trace with both, such as default.")
        if self.fraction in (0, 1):
            return others, chosen, self.fraction
        # Drawn with chance p, a kind whose pods ask m on average holds p m / (p m + (1 - p) o) of the demand.
        mean_chosen = statistics.mean(map(_demand, chosen))
        mean_others = statistics.mean(map(_demand, others))
        weight = self.fraction * mean_others
        return others, chosen, weight / (weight + (1 - self.fraction) * mean_chosen)


def vary(rows: list[dict[str, str]], specs: Sequence[str], rng: random.Random, spec_fraction: float,
         host_spread: float, share_range: tuple[int, int] | None, redraw: Redraw | None = None,
         cpu_only_scale: float = 1.0) -> list[dict[str, str]]:
    """The rows with the asked-for changes, each pod's random draws made in the order the docstring gives."""
    others, chosen, chance = redraw.pools(rows) if redraw is not None else ([], [], 0.0)
    varied = []
    for source in rows:
        row = dict(source)
        if redraw is not None and int(row["num_gpu"]) > 0:
            row = {**rng.choice(chosen if rng.random() < chance else others), "name": source["name"]}
        if spec_fraction and int(row["num_gpu"]) > 0 and rng.random() < spec_fraction:
            row["gpu_spec"] = rng.choice(specs)
        if host_spread:
            for column in ("cpu_milli", "memory_mib"):
                row[column] = str(max(1, int(int(row[column]) * rng.uniform(1 - host_spread, 1 + host_spread))))
        if share_range is not None and _sharing(row):
            row["gpu_milli"] = str(rng.randint(*share_range))
        if cpu_only_scale != 1 and int(row["num_gpu"]) == 0:
            whole = int(cpu_only_scale)
            count = whole + (rng.random() < cpu_only_scale - whole)
            varied.extend({**row, "name": row["name"] if k == 0 else f"{row['name']}-c{k}"} for k in range(count))
            continue
        varied.append(row)
    return varied


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=openb.DEFAULT_DATA, help="folder with the openb CSV files")
    parser.add_argument("--trace", default="default", help="the openb trace to vary, or a pod list file")
    parser.add_argument("--out", type=Path, required=True, help="CSV file to write")
    parser.add_argument("--seed", type=int, default=7)
    redraws = parser.add_mutually_exclusive_group()
    redraws.add_argument("--share-demand", type=lambda t: _fraction(t, "--share-demand", False), default=None)
    redraws.add_argument("--multi-gpu-demand", type=lambda t: _fraction(t, "--multi-gpu-demand", False), default=None)
    parser.add_argument("--spec-fraction", type=lambda t: _fraction(t, "--spec-fraction", False), default=0.0)
    parser.add_argument("--spec-from", default="gpuspec20", help="the trace whose constrained pods' gpu_spec is drawn")
    parser.add_argument("--host-spread", type=lambda t: _fraction(t, "--host-spread", True), default=0.0)
    parser.add_argument("--share-range", type=_share_range, default=None)
    parser.add_argument("--cpu-only-scale", type=_scale, default=1.0)
    args = parser.parse_args(argv)
    try:
        rows = openb.pod_rows(args.data, args.trace)
        specs: list[str] = []
        if args.spec_fraction:
            specs = [row["gpu_spec"] for row in openb.pod_rows(args.data, args.spec_from) if row.get("gpu_spec")]
            if not specs:
                raise openb.TraceError(f"The {args.spec_from} trace has no pod with a gpu_spec to draw from; pass "
                                       "--spec-from a trace with constrained pods, such as gpuspec20.")
        redraw = (Redraw("--share-demand", _sharing, args.share_demand) if args.share_demand is not None else
                  Redraw("--multi-gpu-demand", _multi_gpu, args.multi_gpu_demand)
                  if args.multi_gpu_demand is not None else None)
        varied = vary(rows, specs, random.Random(args.seed), args.spec_fraction, args.host_spread, args.share_range,
                      redraw, args.cpu_only_scale)
    except openb.TraceError as exc:
        print(exc, file=sys.stderr)
        return 2
    columns = list(rows[0])
    if "gpu_spec" not in columns:
        columns.append("gpu_spec")
    with args.out.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, restval="")
        writer.writeheader()
        writer.writerows(varied)
    shapes = {(r["num_gpu"], r["gpu_milli"], r["cpu_milli"], r.get("gpu_spec", "")) for r in varied}
    print(f"{len(varied)} pods of {openb.trace_name(args.trace)}, {len(shapes)} shapes (GPUs, share, CPU, models) "
          f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
