"""``gpushare-device-plugin``: the kubelet device plugin for ``aliyun.com/gpu-mem``."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from deviceplugin.gpus import GPUBackend
from deviceplugin.isolation import Isolation, IsolationConfig, missing_files
from deviceplugin.plugin import DEFAULT_PLUGIN_DIR, DEFAULT_POD_RESOURCES_SOCKET, DevicePlugin, PluginConfig
from gpushare.clusterspec import ClusterSpecError, NodeSpec, load_cluster_spec
from gpushare.contract import MemoryUnit
from gpushare.kube.client import KubeConfigError, connect
from gpushare.logs import LEVELS, configure_logging


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpushare-device-plugin", description=__doc__)
    p.add_argument("--node-name", default=os.environ.get("NODE_NAME"),
                   help="this node's name (default: $NODE_NAME)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else the pod's "
                                        "service account)")
    p.add_argument("--context", help="kubeconfig context to use (default: its current-context)")
    p.add_argument("--backend", choices=("nvml", "simulated"), default="nvml",
                   help="where GPUs come from: the NVIDIA driver, or a cluster description (--cluster)")
    p.add_argument("--cluster", type=Path, help="cluster description YAML for --backend simulated")
    p.add_argument("--simulate-control", type=Path,
                   help="JSON-lines file of injected XID events and memory usage (--backend simulated)")
    p.add_argument("--unit", choices=[u.value for u in MemoryUnit], default=MemoryUnit.GiB.value,
                   help="memory per advertised device (default GiB; MiB makes very long device lists)")
    p.add_argument("--device-plugin-dir", type=Path, default=DEFAULT_PLUGIN_DIR,
                   help=f"the kubelet's device plugin folder (default {DEFAULT_PLUGIN_DIR})")
    p.add_argument("--pod-resources-socket", type=Path, default=DEFAULT_POD_RESOURCES_SOCKET,
                   help=f"the kubelet's PodResources socket (default {DEFAULT_POD_RESOURCES_SOCKET})")
    p.add_argument("--isolation", choices=[i.value for i in Isolation], default=Isolation.NONE.value,
                   help="how containers are held to their share (default none)")
    defaults = IsolationConfig()
    p.add_argument("--hami-library", default=defaults.hami_library,
                   help=f"host path of HAMi-core's libvgpu.so (default {defaults.hami_library})")
    p.add_argument("--hami-preload", default=defaults.hami_preload,
                   help=f"host file mounted as the container's /etc/ld.so.preload (default {defaults.hami_preload})")
    p.add_argument("--mps-pipe-dir", default=defaults.mps_pipe_dir,
                   help=f"the MPS daemon's pipe folder on the host (default {defaults.mps_pipe_dir})")
    p.add_argument("--mps-shm-dir", default=defaults.mps_shm_dir,
                   help=f"the MPS daemon's shared-memory folder on the host, mounted as the client containers' "
                        f"/dev/shm; '' mounts none (default {defaults.mps_shm_dir})")
    p.add_argument("--health-recovery-seconds", type=float, default=600.0,
                   help="how long a GPU must go without a critical XID to be Healthy again (default 600)")
    p.add_argument("--reconcile-seconds", type=float, default=30.0,
                   help="how often pod annotations are checked against the kubelet's PodResources (default 30)")
    p.add_argument("--usage-seconds", type=float, default=15.0,
                   help="how often GPU memory usage is sampled (default 15)")
    p.add_argument("--metrics-address", default="0.0.0.0", help="address of /healthz, /readyz, /metrics")
    p.add_argument("--metrics-port", type=int, default=9445, help="port of /healthz, /readyz, /metrics")
    p.add_argument("--log-level", choices=LEVELS, default="INFO",
                   help="least severe level to log, as JSON lines on stderr (default INFO)")
    return p


class UsageError(Exception):
    """A setting the plugin cannot start with; the text says which and what to do."""


def load_node(args: argparse.Namespace, node_name: str) -> NodeSpec | None:
    """The node's GPUs from the cluster description, for ``--backend simulated``; ``None`` for NVML."""
    if args.backend != "simulated":
        return None
    if args.cluster is None:
        raise UsageError("--backend simulated needs --cluster FILE, the cluster description to read GPUs from.")
    try:
        spec = load_cluster_spec(args.cluster)
    except ClusterSpecError as exc:
        raise UsageError(str(exc)) from None
    for node in spec.nodes:
        if node.name == node_name:
            return node
    names = ", ".join(n.name for n in spec.nodes[:5]) + (" and more" if len(spec.nodes) > 5 else "")
    raise UsageError(f"The cluster description {args.cluster} has no node named {node_name[:63]!r} (the "
                     f"--node-name); it describes {names or 'no nodes'}.")


def make_backend(args: argparse.Namespace, node: NodeSpec | None) -> GPUBackend:
    if node is None:
        from deviceplugin.nvml import NvmlBackend

        return NvmlBackend()
    from deviceplugin.simulated import SimulatedBackend

    return SimulatedBackend(node, args.simulate_control)


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        if not args.node_name:
            raise UsageError("Set --node-name or NODE_NAME (in a DaemonSet: valueFrom fieldRef spec.nodeName).")
        # Local files first: a wrong one is reported before any connection is tried.
        node = load_node(args, args.node_name)
        isolation = IsolationConfig(Isolation(args.isolation), args.hami_library, args.hami_preload,
                                    args.mps_pipe_dir, args.mps_shm_dir)
        # A simulated node has no host to mount from: its containers only ever show the settings.
        problem = missing_files(isolation) if node is None else None
        if problem is not None:
            raise UsageError(problem)
        kube = connect(args.kubeconfig, args.context)
    except (UsageError, KubeConfigError) as exc:
        # Exit code 2, as argparse uses for a bad command line: the operator must change a setting.
        print(f"gpushare-device-plugin: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    # Logging first: the NVML backend reports a missing driver as it starts, and that sentence must be a JSON
    # line at the operator's level like every other.
    configure_logging(args.log_level)
    backend = make_backend(args, node)
    # watchfiles logs every folder change at INFO; the plugin logs the ones that matter itself.
    logging.getLogger("watchfiles").setLevel(logging.WARNING)
    unit = MemoryUnit(args.unit)
    plugin_config = PluginConfig(
        node_name=args.node_name, unit=unit, plugin_dir=args.device_plugin_dir,
        pod_resources_socket=args.pod_resources_socket,
        isolation=isolation,
        health_recovery_s=args.health_recovery_seconds, reconcile_s=args.reconcile_seconds,
        usage_s=args.usage_seconds, metrics_address=args.metrics_address, metrics_port=args.metrics_port)
    plugin = DevicePlugin(plugin_config, backend, kube)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    plugin.start()
    done.wait()
    plugin.stop()
    sys.exit(0)


if __name__ == "__main__":
    main()
