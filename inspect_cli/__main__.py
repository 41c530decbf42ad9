"""``kubectl inspect gpushare [-d] [NODE]``: GPU memory allocation per node and GPU (kubectl plugin)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from inspect_cli import render
from inspect_cli.cluster import ClusterError, open_cluster, read_cluster
from inspect_cli.report import cluster_report


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kubectl inspect gpushare",
        description="Show how much GPU memory gpushare has allocated on each node and GPU.")
    p.add_argument("node", nargs="?", metavar="NODE", help="show only this node")
    p.add_argument("-d", "--details", action="store_true", help="list the pods holding memory on each GPU")
    p.add_argument("-o", "--output", choices=("table", "wide", "json", "yaml"), default="table",
                   help="wide: one row per GPU with model, health and NVML used memory; json/yaml: everything")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else the pod's "
                                        "service account)")
    p.add_argument("--context", help="kubeconfig context to use")
    return p


def run(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        nodes, pods = read_cluster(open_cluster(args.kubeconfig, args.context), args.node)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    report = cluster_report(nodes, pods)
    if args.output == "json":
        text = render.as_json(report)
    elif args.output == "yaml":
        text = render.as_yaml(report)
    elif args.details:
        text = render.details(report, with_gpus=args.output == "wide")
    elif args.output == "wide":
        text = render.wide(report)
    else:
        text = render.summary(report)
    sys.stdout.write(text)
    return 0


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()
