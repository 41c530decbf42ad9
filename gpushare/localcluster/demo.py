"""The demo: every gpushare component, for real, on the local cluster with simulated GPUs.

It starts the local API server, one device plugin process and one simulated kubelet per node, the extender
process and the scheduler loop; submits a mixed set of pods; then prints where each landed, the environment
each container received, and ``kubectl inspect gpushare`` (plain and ``-d``). A second act fills the A100s
with batch pods of a low PriorityClass and submits an urgent one of a high class that fits nowhere: the
scheduler loop's preemption asks the extender which pods to evict, and the demo shows who was preempted and
where the urgent pod ran. A third act submits a gang (a coscheduling PodGroup of three) one member short: its
members wait, and bind together once the last one arrives.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml
from kubernetes import client
from tabulate import tabulate

from gpushare import contract
from gpushare.clusterspec import ClusterSpec, GPUSpec, NodeSpec
from gpushare.localcluster import LocalCluster
from gpushare.localcluster.kubelet import SimulatedKubelet
from gpushare.localcluster.scheduler import SchedulerLoop

T4 = {"model": "Tesla-T4", "memoryMiB": 15360}
V100 = {"model": "Tesla-V100-SXM2-16GB", "memoryMiB": 16160}
A100 = {"model": "NVIDIA-A100-SXM4-80GB", "memoryMiB": 81920}
A10 = {"model": "NVIDIA-A10", "memoryMiB": 23028}


def demo_cluster() -> ClusterSpec:
    """Three nodes of mixed GPUs, one of them with two models on the same node."""

    def gpus(*specs: dict[str, Any], nvlink: tuple[tuple[int, int], ...] = ()) -> list[GPUSpec]:
        out = [GPUSpec.model_validate({**s, "numa": i // 2}) for i, s in enumerate(specs)]
        for a, b in nvlink:
            out[a].nvlink.append(b)
            out[b].nvlink.append(a)
        return out

    return ClusterSpec(nodes=[
        NodeSpec(name="gpu-node-a", gpus=gpus(T4, T4, V100, V100, nvlink=((2, 3),))),
        NodeSpec(name="gpu-node-b", gpus=gpus(A100, A100, A100, A100, nvlink=((0, 1), (2, 3)))),
        NodeSpec(name="gpu-node-c", cpu="16", memory="64Gi", gpus=gpus(A10, T4)),
    ])


def _pod(name: str, containers: dict[str, int], annotations: dict[str, str] | None = None,
         cpu: str = "1") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations or {}},
            "spec": {"containers": [
                {"name": c, "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                 "resources": {"limits": {contract.RESOURCE_GPU_MEM: str(units)} if units else {},
                               "requests": {"cpu": cpu, "memory": "1Gi"}}}
                for c, units in containers.items()]}}


def demo_pods() -> list[dict[str, Any]]:
    """A mixed workload: shares, several containers, several GPUs, model choice, exclusivity, mistakes."""
    pod = _pod
    return [
        pod("notebook-1", {"jupyter": 4}),
        pod("notebook-2", {"jupyter": 4}),
        pod("inference-t4", {"server": 6}, {contract.ANN_GPU_MODEL: "Tesla-T4"}),
        # These two are kept off the A100s, which the preemption act below fills to the last GiB.
        pod("trainer-pair", {"trainer": 12, "metrics": 2}, {contract.HAMI_NOUSE_GPUTYPE: "A100"}),
        pod("llm-2gpu", {"worker": 120}, {contract.ANN_GPU_COUNT: "2",
                                          contract.ANN_GPU_MODEL: "NVIDIA-A100-SXM4-80GB"}),
        pod("bench-exclusive", {"bench": 16}, {contract.ANN_EXCLUSIVE: "true",
                                               contract.HAMI_USE_GPUTYPE: "V100"}),
        pod("shared-compute", {"app": 8}, {contract.ANN_COMPUTE: "30", contract.HAMI_NOUSE_GPUTYPE: "A100"}),
        pod("too-big", {"giant": 200}),
        pod("cpu-only", {"web": 0}),
    ]


BATCH_CLASS, URGENT_CLASS = "demo-batch", "demo-urgent"


def priority_classes() -> list[dict[str, Any]]:
    return [{"metadata": {"name": BATCH_CLASS}, "value": 100, "description": "batch work that may be preempted"},
            {"metadata": {"name": URGENT_CLASS}, "value": 10000, "description": "work that preempts batch"}]


def preemption_pods() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Batch pods that leave no A100 with 80 GiB free (60 + 60 + 20 next to llm-2gpu's 2 x 60), then an urgent
    pod that needs a whole A100: only evicting pods of lower priority makes room for it."""
    a100 = {contract.ANN_GPU_MODEL: "NVIDIA-A100-SXM4-80GB"}
    batch = [_with_class(_pod(name, {"job": units}, a100), BATCH_CLASS)
             for name, units in (("batch-a", 60), ("batch-b", 60), ("batch-c", 20))]
    return batch, _with_class(_pod("urgent-finetune", {"trainer": 80}, a100), URGENT_CLASS)


GANG = "train"
GANG_SIZE = 3


def pod_group() -> dict[str, Any]:
    return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": {"name": GANG},
            "spec": {"minMember": GANG_SIZE, "scheduleTimeoutSeconds": 60}}


def gang_pods() -> list[dict[str, Any]]:
    """The members of the PodGroup: one 20 GiB worker each, to be placed all at once or not at all."""
    members = [_pod(f"{GANG}-{i}", {"worker": 20}) for i in range(GANG_SIZE)]
    for manifest in members:
        manifest["metadata"]["labels"] = {contract.LABEL_POD_GROUP: GANG}
    return members


def _with_class(manifest: dict[str, Any], priority_class: str) -> dict[str, Any]:
    manifest["spec"]["priorityClassName"] = priority_class
    return manifest


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# The component processes the demo started, with their log files: _wait watches them.
Components = list[tuple[subprocess.Popen[bytes], Path]]


def _tail(log: Path, lines: int = 10) -> str:
    """The end of a component's log; the components write their errors there, not to the demo's terminal."""
    text = log.read_text(errors="replace").rstrip() if log.exists() else ""
    shown = "\n".join("  | " + line for line in text.splitlines()[-lines:]) or "  | (empty)"
    return f"last lines of {log}:\n{shown}"


def _wait(what: str, ready: Callable[[], bool], components: Components, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for proc, log in components:
            if proc.poll() is not None:  # a component that died will never become ready: say why at once
                raise RuntimeError(f"{log.stem} exited with code {proc.returncode} while the demo waited for "
                                   f"{what}; {_tail(log)}")
        with contextlib.suppress(Exception):
            if ready():
                return
        time.sleep(0.2)
    tails = "\n".join(_tail(log) for _, log in components)
    raise RuntimeError(f"The demo gave up waiting for {what} after {timeout_s:.0f} s; {tails}")


@contextlib.contextmanager
def _process(args: list[str], log: Path, components: Components) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        components.append((proc, log))
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _inspect(kubeconfig: Path, *args: str) -> str:
    """``kubectl inspect gpushare`` through kubectl's plugin mechanism when kubectl is there."""
    bindir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    kubectl = shutil.which("kubectl", path=env["PATH"])
    command = [kubectl, "inspect", "gpushare"] if kubectl else [str(Path(bindir) / "kubectl-inspect-gpushare")]
    shown = "kubectl inspect gpushare" if kubectl else "kubectl-inspect-gpushare"
    result = subprocess.run([*command, "--kubeconfig", str(kubeconfig), *args], env=env, capture_output=True,
                            text=True, check=False)
    return f"$ {shown} {' '.join(args)}\n{result.stdout}{result.stderr}"


def run_demo(workdir: Path, policy: str) -> None:
    spec = demo_cluster()
    spec_file = workdir / "cluster.yaml"
    spec_file.write_text(yaml.safe_dump(spec.model_dump(by_alias=True, exclude_defaults=True)))
    python = sys.executable
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(LocalCluster(spec, publish_inventory=False))
        kubeconfig = cluster.write_kubeconfig(workdir / "kubeconfig")
        print(f"local cluster: {cluster.url} (kubeconfig {kubeconfig}, logs in {workdir})")
        api = cluster.api_client()
        kubelets: list[SimulatedKubelet] = []
        components: Components = []
        for node in spec.nodes:
            # unix socket paths must stay short, so the kubelet folders live directly under /tmp
            plugin_dir = Path(tempfile.mkdtemp(prefix="gs-", dir="/tmp"))
            stack.callback(shutil.rmtree, plugin_dir, True)
            kubelets.append(stack.enter_context(SimulatedKubelet(api, node.name, plugin_dir)))
            stack.enter_context(_process(
                [python, "-m", "deviceplugin", "--node-name", node.name, "--kubeconfig", str(kubeconfig),
                 "--backend", "simulated", "--cluster", str(spec_file), "--device-plugin-dir", str(plugin_dir),
                 "--pod-resources-socket", str(plugin_dir / "pod-resources.sock"), "--metrics-port", "0",
                 "--isolation", "hami-core"],
                workdir / f"device-plugin-{node.name}.log", components))
        port = _free_port()
        stack.enter_context(_process(
            [python, "-m", "extender", "--host", "127.0.0.1", "--port", str(port), "--kubeconfig", str(kubeconfig),
             "--policy", policy], workdir / "extender.log", components))
        extender = f"http://127.0.0.1:{port}"
        _wait("the extender to be ready", lambda: httpx.get(extender + "/readyz").status_code == 200, components)
        core: Any = client.CoreV1Api(api)
        _wait("every node's device plugin to publish its GPUs", lambda: all(
            contract.RESOURCE_GPU_MEM in (n.status.allocatable or {}) for n in core.list_node().items), components)
        print(f"extender: {extender} (policy {policy}); {len(spec.nodes)} nodes, each with a device plugin "
              "and a simulated kubelet\n")
        loop = stack.enter_context(SchedulerLoop(api, extender + "/gpushare-scheduler"))
        loop.start()
        # One pod at a time, each settled before the next, as a user applying manifests one by one: kube-scheduler
        # binds in the background, so pods submitted in a burst are placed in an order and against bind progress
        # that vary from run to run, and so would the story the acts below tell.
        for manifest in demo_pods():
            core.create_namespaced_pod("default", manifest)
            _wait(f"pod {manifest['metadata']['name']} to settle", lambda: _settled(core), components, timeout_s=90)
        _report(core, kubelets)
        print(_inspect(kubeconfig))
        print(_inspect(kubeconfig, "-d"))
        _act_preemption(api, core, components)
        print(_inspect(kubeconfig, "-d"))
        _act_gang(api, core, components)


def _act_preemption(api: client.ApiClient, core: Any, components: Components) -> None:
    scheduling: Any = client.SchedulingV1Api(api)
    for body in priority_classes():
        scheduling.create_priority_class(body)
    batch, urgent = preemption_pods()
    for manifest in batch:
        core.create_namespaced_pod("default", manifest)
    names = [m["metadata"]["name"] for m in batch]
    _wait("the batch pods to run", lambda: all(_phase(core, n) == "Running" for n in names), components)
    name = urgent["metadata"]["name"]
    print(f"Preemption: {', '.join(names)} run with PriorityClass {BATCH_CLASS} (100) beside the pods above "
          f"(priority 0); {name} (PriorityClass {URGENT_CLASS}, 10000) asks for a whole A100, which no GPU has "
          "free.\n")
    core.create_namespaced_pod("default", urgent)
    _wait(f"{name} to run", lambda: _phase(core, name) == "Running", components, timeout_s=90)
    events = core.list_namespaced_event("default").items
    rows = [[e.involved_object.name, e.reason, e.message] for e in events
            if e.reason in ("Preempted", "FailedScheduling") and (e.reason == "Preempted" or e.involved_object.name
                                                                  == name)]
    rows.append(_running_row(core, name))
    _print_rows(rows)


def _act_gang(api: client.ApiClient, core: Any, components: Components) -> None:
    client.CustomObjectsApi(api).create_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", "default",
                                                                 "podgroups", pod_group())
    *early, last = gang_pods()
    for manifest in early:
        core.create_namespaced_pod("default", manifest)
    first = early[0]["metadata"]["name"]
    _wait(f"{first} to be told to wait for its gang",
          lambda: "waiting for 1 more" in _failures(core).get(first, ""), components)
    print(f"Gang: PodGroup {GANG} (minMember {GANG_SIZE}); {len(early)} members submitted, then the last:\n")
    rows = [[first, "FailedScheduling", _failures(core)[first]]]
    core.create_namespaced_pod("default", last)
    names = [m["metadata"]["name"] for m in (*early, last)]
    _wait("the gang to run", lambda: all(_phase(core, n) == "Running" for n in names), components, timeout_s=90)
    rows.extend(_running_row(core, name) for name in names)
    _print_rows(rows)


def _running_row(core: Any, name: str) -> list[str]:
    """Where a running pod is and what it holds, as bind wrote it."""
    pod = core.read_namespaced_pod(name, "default")
    ann = pod.metadata.annotations or {}
    return [name, "Running", f"on {pod.spec.node_name}, GPU(s) {ann.get(contract.ANN_GPU_INDICES, '-')}, "
                             f"{ann.get(contract.ANN_POD, '-')} GiB"]


def _print_rows(rows: list[list[str]]) -> None:
    print(tabulate(rows, headers=["POD", "WHAT", "MESSAGE"], maxcolwidths=[None, None, 90]))
    print()


def _phase(core: Any, name: str) -> str:
    return str(core.read_namespaced_pod(name, "default").status.phase)


def _failures(core: Any) -> dict[str, str]:
    """The latest FailedScheduling message per pod, as kube-scheduler would show it in events."""
    events = sorted(core.list_namespaced_event("default").items,
                    key=lambda e: (e.last_timestamp or e.event_time or 0, e.metadata.resource_version))
    return {e.involved_object.name: e.message for e in events if e.reason == "FailedScheduling"}


def _settled(core: Any) -> bool:
    failed = _failures(core)
    return all(p.status.phase == "Running" or p.metadata.name in failed
               for p in core.list_namespaced_pod("default").items)


def _report(core: Any, kubelets: list[SimulatedKubelet]) -> None:
    failed = _failures(core)
    envs = {pod: containers for k in kubelets for pod, containers in k.allocations.items()}
    placed, env_rows = [], []
    for pod in sorted(core.list_namespaced_pod("default").items, key=lambda p: p.metadata.name):
        ann = pod.metadata.annotations or {}
        outcome = "Running" if pod.status.phase == "Running" else failed.get(pod.metadata.name, pod.status.phase)
        placed.append([pod.metadata.name, pod.spec.node_name or "-", ann.get(contract.ANN_GPU_INDICES, "-"),
                       ann.get(contract.ANN_POD, "-"), outcome])
        for container, env in sorted(envs.get(f"default/{pod.metadata.name}", {}).items()):
            shown = {k: v for k, v in sorted(env.items())
                     if k.startswith(("NVIDIA_", "ALIYUN_COM_GPU_MEM_", "CUDA_"))}
            env_rows.append([f"{pod.metadata.name}/{container}", "\n".join(f"{k}={v}" for k, v in shown.items())])
    print("Where each pod landed:")
    print(tabulate(placed, headers=["POD", "NODE", "GPU(S)", "GiB", "STATUS"], maxcolwidths=[None] * 4 + [70]))
    print("\nWhat each container received from the device plugin (Allocate):")
    print(tabulate(env_rows, headers=["POD/CONTAINER", "ENV"], tablefmt="grid"))
    print()
