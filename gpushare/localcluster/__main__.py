"""``gpushare-local-cluster``: run the local API server until SIGINT or SIGTERM (for the demo and manual tests)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from types import FrameType

from gpushare.clusterspec import ClusterSpec, ClusterSpecError, load_cluster_spec
from gpushare.localcluster.cluster import LocalCluster
from gpushare.localcluster.resources import CRDS
from gpushare.logs import LEVELS, configure_logging

log = logging.getLogger("gpushare.localcluster")

DEFAULT_PORT = 8001


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="gpushare-local-cluster",
        description="A local Kubernetes API server (in memory, no authentication) for gpushare's tests and demo. "
                    "Never use it in place of a real cluster.")
    parser.add_argument("--cluster", metavar="FILE", help="cluster description (YAML) whose nodes to create")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on, 0 for any free one "
                        "(default: %(default)s)")
    parser.add_argument("--kubeconfig", metavar="OUT", help="write a kubeconfig for this cluster to OUT")
    parser.add_argument("--no-inventory", action="store_true",
                        help="do not publish GPU resources and inventory on nodes (leave it to the device plugin)")
    parser.add_argument("--event-window", type=int, default=1000, metavar="N",
                        help="changes per kind a watch can resume from before it gets 410 Gone (default: %(default)s)")
    parser.add_argument("--no-podgroups", action="store_true",
                        help="do not serve scheduler-plugins' PodGroup CRD (scheduling.x-k8s.io/v1alpha1 podgroups), "
                             "as a cluster without coscheduling")
    parser.add_argument("--log-level", default="INFO", choices=LEVELS,
                        help="least severe level to log, as JSON lines on stderr (default: %(default)s)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging(args.log_level)
    try:
        spec = load_cluster_spec(args.cluster) if args.cluster else ClusterSpec()
    except ClusterSpecError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.event_window < 1:
        print("--event-window must be at least 1.", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    cluster = LocalCluster(spec, publish_inventory=not args.no_inventory, host=args.host, port=args.port,
                           event_window=args.event_window, crds=() if args.no_podgroups else CRDS)
    try:
        cluster.start()
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        return 1
    try:
        if args.kubeconfig:
            path = cluster.write_kubeconfig(args.kubeconfig)
            log.info("wrote kubeconfig", extra={"path": str(path)})
        print(cluster.url, flush=True)
        log.info("local cluster ready", extra={"url": cluster.url, "nodes": len(spec.nodes)})
        stop.wait()
        log.info("stopping local cluster")
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
