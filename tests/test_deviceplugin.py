"""The device plugin's pure parts: device IDs, matching Allocate to pods, preferred devices, isolation env,
health, over-share detection, NVML helpers, the simulated backend's control file, and the no-driver path."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pynvml
import pytest
from conftest import driver_gpus, short_tmpdir, with_driver, without_driver
from kubernetes import client
from test_kubelet import eventually

from deviceplugin.__main__ import main
from deviceplugin.devices import device_id, device_ids, gpus_of, units_of, uuid_of
from deviceplugin.gpus import GPUDevice, ProcessUsage, XidEvent
from deviceplugin.inventory import Inventory
from deviceplugin.isolation import ContainerGrant, Isolation, IsolationConfig, Mount, container_environment
from deviceplugin.matching import (
    Match,
    Waiting,
    choose,
    no_pending_message,
    preferred_devices,
    served_containers,
    split_evenly,
    unplaced_pods,
    waiting_pods,
)
from deviceplugin.nvml import NvmlBackend, pair_score, pod_of_cgroup
from deviceplugin.simulated import SimulatedBackend
from deviceplugin.usage import find_overuse
from gpushare.clusterspec import NodeSpec
from gpushare.contract import (
    ANN_AFFINITY,
    ANN_ALLOCATED_CONTAINERS,
    ANN_ANTI_AFFINITY,
    ANN_ASSIGNED,
    ANN_COMPUTE,
    ANN_EXCLUSIVE,
    KUBESHARE_EXCLUSION,
    RESOURCE_GPU_COUNT,
    RESOURCE_GPU_MEM,
    ContainerInfo,
    MemoryUnit,
    PodInfo,
    new_assignment,
    parse_request,
)
from gpushare.localcluster import LocalCluster

V100 = GPUDevice(index=0, uuid="GPU-aaaa", model="V100", memory_mib=16160, numa=0)
A100 = GPUDevice(index=1, uuid="GPU-bbbb", model="A100", memory_mib=40960, numa=1)


def placed(name: str, shares: dict[str, int], gpus: tuple[int, ...] = (0,), assume: int = 1, count: int = 1,
           extra: dict[str, str] | None = None, legacy: bool = False, phase: str = "Pending") -> PodInfo:
    """A pod as the extender leaves it at bind."""
    containers = []
    for i, (container, units) in enumerate(shares.items()):
        limits = {RESOURCE_GPU_MEM: str(units)}
        if i == 0 and count > 1:
            limits[RESOURCE_GPU_COUNT] = str(count)
        containers.append(ContainerInfo(container, limits))
    pod = PodInfo("default", name, uid=f"uid-{name}", node_name="n1", containers=tuple(containers),
                  annotations=dict(extra or {}), resource_version="5", phase=phase)
    annotations = new_assignment(parse_request(pod), gpus, 16, MemoryUnit.GiB, assume).annotations()
    if legacy:
        annotations = {k: v for k, v in annotations.items() if not k.startswith("gpushare.io/")}
    return PodInfo("default", name, uid=pod.uid, node_name="n1", containers=pod.containers, phase=phase,
                   annotations={**annotations, **(extra or {})}, resource_version="5")


# Device IDs


def test_device_ids_name_their_gpu_and_round_to_the_nearest_unit() -> None:
    assert units_of(V100, MemoryUnit.GiB) == 16  # 16160 MiB: flooring would say 15
    assert units_of(V100, MemoryUnit.MiB) == 16160
    ids = device_ids(V100, MemoryUnit.GiB)
    assert ids[0] == "GPU-aaaa-_-0" and ids[-1] == "GPU-aaaa-_-15"
    assert uuid_of(device_id("GPU-x-y", 7)) == "GPU-x-y"
    assert gpus_of(["GPU-aaaa-_-1", "GPU-bbbb-_-2", "GPU-bbbb-_-3"], {"GPU-aaaa": 0, "GPU-bbbb": 1}) == {0: 1, 1: 2}


@pytest.mark.parametrize("bad", ["GPU-aaaa", "GPU-aaaa-_-x", "-_-3"])
def test_a_foreign_device_id_is_rejected_with_a_sentence(bad: str) -> None:
    with pytest.raises(ValueError, match="is not one of gpushare's"):
        uuid_of(bad)


def test_a_device_of_an_unknown_gpu_is_rejected() -> None:
    with pytest.raises(ValueError, match="which this node does not have"):
        gpus_of(["GPU-zzzz-_-0"], {"GPU-aaaa": 0})


# Matching Allocate to a pod


def one(waiting: list[Waiting], units: int, devices: Counter[int]) -> Match:
    """The match of an Allocate call with one container request."""
    matches = choose(waiting, [(units, devices)])
    assert matches is not None and len(matches) == 1
    return matches[0]


def test_the_pod_whose_gpu_the_devices_come_from_wins_over_an_older_one() -> None:
    older = placed("older", {"c": 4}, gpus=(0,), assume=1)
    newer = placed("newer", {"c": 4}, gpus=(1,), assume=2)
    match = one(waiting_pods([older, newer]), 4, Counter({1: 4}))
    assert match.waiting.pod.name == "newer" and match.gpus == (1,) and not match.moved


def test_without_a_gpu_hint_the_pod_bound_first_wins() -> None:
    # Concurrent binds: "first" was assumed after "second" but its Binding landed first, so the kubelet, which
    # watches the same API server, admits it first.
    first = placed("first", {"c": 4}, gpus=(0,), assume=2)
    second = placed("second", {"c": 4}, gpus=(0,), assume=1)
    assert one(waiting_pods([first, second]), 4, Counter({0: 4})).waiting.pod.name == "first"


def test_devices_of_another_gpu_move_the_pod_there() -> None:
    match = one(waiting_pods([placed("p", {"c": 4}, gpus=(0,))]), 4, Counter({1: 4}))
    assert match.gpus == (1,) and match.moved


def test_exclusive_compute_and_sharing_pods_keep_the_extenders_gpu() -> None:
    for extra in ({ANN_EXCLUSIVE: "true"}, {ANN_COMPUTE: "30"}, {ANN_AFFINITY: "red"},
                  {ANN_ANTI_AFFINITY: "solo"}, {KUBESHARE_EXCLUSION: "x"}):
        match = one(waiting_pods([placed("p", {"c": 4}, gpus=(0,), extra=extra)]), 4, Counter({1: 4}))
        assert match.gpus == (0,)


def test_devices_split_over_gpus_do_not_move_a_single_gpu_pod() -> None:
    match = one(waiting_pods([placed("p", {"c": 4}, gpus=(0,))]), 4, Counter({0: 2, 1: 2}))
    assert match.gpus == (0,) and not match.moved


def test_containers_of_one_pod_are_matched_in_spec_order_by_their_own_share() -> None:
    pod = placed("multi", {"train": 4, "side": 2})
    first = one(waiting_pods([pod]), 4, Counter({0: 4}))
    assert first.container == "train" and not first.waiting.is_last("train")
    served = waiting_pods([pod], allocated={pod.uid: frozenset({"train"})})
    second = one(served, 2, Counter({0: 2}))
    assert second.container == "side" and second.waiting.is_last("side")


def test_a_pod_whose_containers_are_all_served_waits_no_more() -> None:
    pod = placed("multi", {"a": 1, "b": 1}, extra={ANN_ALLOCATED_CONTAINERS: "a,b"})
    assert waiting_pods([pod]) == []
    assert waiting_pods([placed("done", {"c": 1}, extra={ANN_ASSIGNED: "true"})]) == []
    assert waiting_pods([placed("finished", {"c": 1}, phase="Succeeded")]) == []
    assert len(waiting_pods([placed("swapped", {"c": 1}, phase="Running")])) == 1


def test_aliyun_pods_match_on_their_whole_request() -> None:
    legacy = placed("legacy", {"a": 2, "b": 2}, legacy=True)
    match = one(waiting_pods([legacy]), 4, Counter({0: 4}))
    assert not match.waiting.assignment.container_shares and match.container == "" and match.waiting.is_last("")
    assert choose(waiting_pods([legacy]), [(2, Counter({0: 2}))]) is None


def test_a_pod_that_skipped_the_extender_gets_a_message_naming_it_and_the_fix() -> None:
    rogue = PodInfo("default", "rogue", uid="u", node_name="n1",
                    containers=(ContainerInfo("c", {RESOURCE_GPU_MEM: "3"}),))
    other = placed("other", {"c": 5})
    assert choose(waiting_pods([rogue, other]), [(3, Counter({0: 3}))]) is None
    message = no_pending_message("n1", [3], waiting_pods([rogue, other]), unplaced_pods([rogue, other]),
                                 served_containers([rogue, other], [3]), {})
    assert "not placed by the gpushare scheduler extender" in message
    assert "default/rogue" in message and "default/other (c: 5)" in message
    assert "schedulerName" in message


def test_a_container_that_already_got_its_devices_is_named_with_when() -> None:
    done = placed("done", {"train": 4, "side": 2}, extra={ANN_ALLOCATED_CONTAINERS: "train"})
    pods = [done]
    message = no_pending_message("n1", [4], waiting_pods(pods), unplaced_pods(pods), served_containers(pods, [4]),
                                 {done.uid: 0.0})
    assert message.startswith("No pod bound to n1 is waiting for a container of 4 unit(s) of aliyun.com/gpu-mem: "
                              "container train of pod default/done already got its 4 unit(s) on GPU(s) 0; this "
                              "device plugin recorded it at 1970-01-01T00:00:00Z.")
    assert "Pods the extender placed here wait for other sizes: default/done (side: 2)." in message
    assert "not placed by" not in message
    unknown = no_pending_message("n1", [4], [], [], served_containers(pods, [4]), {})
    assert "written before this device plugin process started" in unknown


def test_placed_pods_of_other_sizes_are_the_cause_when_nothing_else_is() -> None:
    pods = [placed("small", {"c": 2})]
    message = no_pending_message("n1", [4, 3], waiting_pods(pods), [], served_containers(pods, [4, 3]), {})
    assert message.startswith("No pod bound to n1 is waiting for containers of 4 and 3 unit(s)")
    assert "default/small (c: 2)" in message and "limits disagree with the shares" in message
    assert "not placed by" not in message
    assert "no pod here asks for that size" in no_pending_message("n1", [4], [], [], [], {})


def test_several_container_requests_are_matched_to_one_pod_as_a_whole() -> None:
    single = placed("single", {"c": 4}, assume=1)
    pair = placed("pair", {"train": 4, "side": 2}, assume=2)
    matches = choose(waiting_pods([single, pair]), [(4, Counter({0: 4})), (2, Counter({0: 2}))])
    assert matches is not None
    assert [(m.waiting.pod.name, m.container) for m in matches] == [("pair", "train"), ("pair", "side")]
    assert not matches[0].waiting.is_last("train") and matches[1].waiting.is_last("side")
    assert choose(waiting_pods([single, pair]), [(4, Counter({0: 4})), (3, Counter({0: 3}))]) is None


def test_preferred_devices_come_from_the_gpu_of_the_matching_pod_bound_first() -> None:
    gpu_of = {f"GPU-aaaa-_-{n}": 0 for n in range(16)} | {f"GPU-bbbb-_-{n}": 1 for n in range(40)}
    available = list(gpu_of)
    waiting = waiting_pods([placed("bound-first", {"c": 4}, gpus=(1,), assume=9),
                            placed("bound-second", {"c": 4}, gpus=(0,), assume=1)])
    chosen = preferred_devices(waiting, 4, available, [], gpu_of)
    assert len(chosen) == 4 and {gpu_of[d] for d in chosen} == {1}


def test_preferred_devices_spread_evenly_over_a_multi_gpu_pods_gpus() -> None:
    gpu_of = {f"GPU-aaaa-_-{n}": 0 for n in range(16)} | {f"GPU-bbbb-_-{n}": 1 for n in range(16)}
    waiting = waiting_pods([placed("wide", {"c": 8}, gpus=(0, 1), count=2)])
    chosen = preferred_devices(waiting, 8, list(gpu_of), [], gpu_of)
    assert Counter(gpu_of[d] for d in chosen) == {0: 4, 1: 4}


def test_without_a_waiting_pod_preferred_devices_fill_the_fullest_gpu_that_fits() -> None:
    gpu_of = {f"GPU-aaaa-_-{n}": 0 for n in range(3)} | {f"GPU-bbbb-_-{n}": 1 for n in range(10)}
    chosen = preferred_devices([], 2, list(gpu_of), [], gpu_of)
    assert {gpu_of[d] for d in chosen} == {0}
    must = ["GPU-bbbb-_-9"]
    assert preferred_devices([], 2, list(gpu_of), must, gpu_of)[0] == "GPU-bbbb-_-9"


def test_split_evenly() -> None:
    assert split_evenly(10, 3) == [4, 3, 3]
    assert split_evenly(8, 2) == [4, 4]


# Isolation env


GRANT = ContainerGrant(gpu_indices=(1, 3), gpu_uuids=("GPU-b", "GPU-d"), container_units=8, pod_units=8,
                       gpu_units=40, limit_mib=(4096, 4096), compute_limit=30)


def test_every_mode_sets_aliyuns_variables() -> None:
    env, mounts = container_environment(GRANT, IsolationConfig())
    assert env == {"NVIDIA_VISIBLE_DEVICES": "GPU-b,GPU-d", "ALIYUN_COM_GPU_MEM_IDX": "1,3",
                   "ALIYUN_COM_GPU_MEM_POD": "8", "ALIYUN_COM_GPU_MEM_CONTAINER": "8", "ALIYUN_COM_GPU_MEM_DEV": "40"}
    assert mounts == []


def test_hami_core_caps_each_cuda_ordinal_and_preloads_the_library() -> None:
    env, mounts = container_environment(GRANT, IsolationConfig(Isolation.HAMI_CORE, hami_library="/opt/vgpu.so",
                                                               hami_preload="/opt/preload"))
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4096m" and env["CUDA_DEVICE_MEMORY_LIMIT_1"] == "4096m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert mounts == [Mount("/usr/local/vgpu/libvgpu.so", "/opt/vgpu.so"), Mount("/etc/ld.so.preload", "/opt/preload")]


def test_mps_pins_memory_per_device_and_mounts_the_pipe_folder() -> None:
    env, mounts = container_environment(GRANT, IsolationConfig(Isolation.MPS, mps_pipe_dir="/run/mps"))
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M,1=4096M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/mps"
    assert mounts == [Mount("/run/mps", "/run/mps", read_only=False), Mount("/dev/shm", "/dev/shm", read_only=False)]


def test_without_a_compute_share_no_sm_or_thread_limit_is_set() -> None:
    grant = ContainerGrant((0,), ("GPU-a",), 4, 4, 16, (4096,))
    for mode in (Isolation.HAMI_CORE, Isolation.MPS):
        env, _ = container_environment(grant, IsolationConfig(mode))
        assert "CUDA_DEVICE_SM_LIMIT" not in env and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env


# Health


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_critical_xid_makes_a_gpu_unhealthy_until_it_is_quiet_for_the_recovery_period() -> None:
    clock = FakeClock()
    inventory = Inventory([V100, A100], MemoryUnit.GiB, recovery_s=60, clock=clock)
    assert not inventory.record(XidEvent(0, 31))  # application fault: health unchanged
    assert inventory.record(XidEvent(0, 79))
    assert not inventory.healthy(0) and inventory.healthy(1)
    assert [e.healthy for e in inventory.entries()] == [False, True]
    clock.now += 59
    assert inventory.recover() == []
    inventory.record(XidEvent(0, 79))  # a repeat restarts the quiet period
    clock.now += 59
    assert inventory.recover() == [] and inventory.seconds_to_recovery() == pytest.approx(1)
    clock.now += 1
    assert inventory.recover() == [0] and inventory.healthy(0)


def test_events_for_unknown_gpus_are_ignored() -> None:
    inventory = Inventory([V100], MemoryUnit.GiB, recovery_s=60)
    assert not inventory.record(XidEvent(7, 79))


# Over-share detection


def test_a_container_above_its_share_is_reported_with_the_share() -> None:
    pod = placed("p", {"train": 4, "side": 2})
    samples = [ProcessUsage(0, 5000, pod.uid, "cid-train"), ProcessUsage(0, 1000, pod.uid, "cid-side")]
    found = find_overuse(samples, [pod], MemoryUnit.GiB, {"cid-train": "train", "cid-side": "side"})
    assert [(o.container, o.used_mib, o.share_mib) for o in found] == [("train", 5000, 4096)]


def test_without_container_names_the_pods_share_per_gpu_applies() -> None:
    pod = placed("p", {"c": 8}, gpus=(0, 1), count=2)
    found = find_overuse([ProcessUsage(1, 4200, pod.uid)], [pod], MemoryUnit.GiB, {})
    assert [(o.container, o.gpu_index, o.share_mib) for o in found] == [("", 1, 4096)]
    assert find_overuse([ProcessUsage(1, 4000, pod.uid)], [pod], MemoryUnit.GiB, {}) == []


# NVML helpers and the no-driver path


def test_pair_scores_follow_hami() -> None:
    assert pair_score(pynvml.NVML_TOPOLOGY_SYSTEM, 0) == 10
    assert pair_score(pynvml.NVML_TOPOLOGY_NODE, 0) == 20
    assert pair_score(pynvml.NVML_TOPOLOGY_HOSTBRIDGE, 0) == 30
    assert pair_score(pynvml.NVML_TOPOLOGY_MULTIPLE, 0) == 40
    assert pair_score(pynvml.NVML_TOPOLOGY_SINGLE, 0) == 50
    assert pair_score(pynvml.NVML_TOPOLOGY_INTERNAL, 0) == 60
    assert pair_score(pynvml.NVML_TOPOLOGY_SYSTEM, 2) == 200


def test_the_pod_of_a_process_is_read_from_its_cgroup() -> None:
    cid = "ab" * 32
    cgroupfs = f"0::/kubepods/burstable/pod1234abcd-12ab-34cd-56ef-1234567890ab/{cid}\n"
    systemd = ("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1234abcd_12ab_34cd_56ef_"
               f"1234567890ab.slice/cri-containerd-{cid}.scope\n")
    for text in (cgroupfs, systemd):
        assert pod_of_cgroup(text) == ("1234abcd-12ab-34cd-56ef-1234567890ab", cid)
    assert pod_of_cgroup("0::/user.slice/session-1.scope\n") is None


@without_driver
def test_without_a_driver_the_real_nvml_backend_reports_no_gpus_in_one_sentence(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="deviceplugin")
    backend = NvmlBackend()
    try:
        assert backend.discover() == []
        assert backend.used_mib() == {} and backend.process_usage() == []
        assert backend.wait_event(0.01) is None
    finally:
        backend.close()
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("deviceplugin")]
    assert len(messages) == 1
    assert "NVIDIA driver is not installed" in messages[0] and "advertises no GPUs" in messages[0]


@with_driver
def test_on_a_gpu_node_the_nvml_backend_reports_the_drivers_gpus() -> None:
    expected = driver_gpus()
    assert expected is not None
    backend = NvmlBackend()
    try:
        gpus = backend.discover()
        assert [(g.uuid, g.memory_mib) for g in gpus] == expected
        assert [g.index for g in gpus] == list(range(len(expected)))
        used = backend.used_mib()
        assert set(used) == set(range(len(expected)))
        assert all(0 <= used[g.index] <= g.memory_mib for g in gpus)
        started = time.monotonic()
        event = backend.wait_event(0.2)  # registered for XIDs (or not, where the GPU refuses): bounded either way
        assert event is None or 0 <= event.gpu_index < len(gpus)
        assert time.monotonic() - started < 5
    finally:
        backend.close()


# The simulated backend


NODE = NodeSpec.model_validate({"name": "n1", "gpus": [
    {"model": "V100", "memoryMiB": 16160, "numa": 0, "nvlink": [1]},
    {"model": "V100", "memoryMiB": 16160, "numa": 0}, {"model": "T4", "memoryMiB": 15360, "usedMiB": 100}]})


def test_the_simulated_backend_reads_the_cluster_description() -> None:
    backend = SimulatedBackend(NODE)
    gpus = backend.discover()
    assert [g.model for g in gpus] == ["V100", "V100", "T4"]
    assert gpus[0].links == {1: 100} and gpus[1].links == {0: 100} and gpus[2].links == {}
    assert gpus[0].uuid == NODE.gpu_uuid(0) and gpus[2].numa is None
    assert backend.used_mib() == {0: 0, 1: 0, 2: 100}


def test_the_control_file_injects_events_and_usage(tmp_path: Path) -> None:
    control = tmp_path / "control.jsonl"
    backend = SimulatedBackend(NODE, control)
    try:
        with control.open("a") as handle:
            handle.write(json.dumps({"gpu": 1, "xid": 79}) + "\n")
            handle.write("not json\n")
            handle.write(json.dumps({"gpu": 2, "usedMiB": 5000}) + "\n")
            handle.write(json.dumps({"gpu": 0, "podUID": "u1", "usedMiB": 700}) + "\n")
        assert backend.wait_event(10) == XidEvent(1, 79)
        deadline = time.monotonic() + 10
        while backend.used_mib()[2] != 5000 or not backend.process_usage():
            assert time.monotonic() < deadline, "the control file's usage lines were not applied"
            time.sleep(0.01)
        assert backend.process_usage() == [ProcessUsage(0, 700, "u1", "")]
    finally:
        backend.close()


# Command line


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What the plugin's command line prints when it refuses ``argv``: one line, exit code 2, no traceback."""
    with pytest.raises(SystemExit) as caught:
        main(argv)
    err = capsys.readouterr().err
    assert caught.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("gpushare-device-plugin: ")
    return err


def test_the_command_line_refuses_incomplete_settings_with_a_sentence(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert "Set --node-name or NODE_NAME" in refused(["--backend", "simulated"], capsys)
    simulated = ["--node-name", "n1", "--backend", "simulated"]
    assert "needs --cluster FILE" in refused(simulated, capsys)
    described = tmp_path / "cluster.yaml"
    described.write_text("nodes: [{name: other, gpus: [{model: T4, memoryMiB: 15360}]}]\n")
    assert (f"The cluster description {described} has no node named 'n1' (the --node-name); it describes other."
            in refused([*simulated, "--cluster", str(described)], capsys))
    # Checked before NVML is touched, so a node without the driver reports the missing files.
    on_node = ["--node-name", "n1"]
    absent = tmp_path / "absent"
    assert (f"--isolation hami-core needs HAMi-core's library (--hami-library) at {absent}/libvgpu.so, and there is "
            "no file there" in refused([*on_node, "--isolation", "hami-core", "--hami-library",
                                        f"{absent}/libvgpu.so"], capsys))
    library = tmp_path / "libvgpu.so"
    library.write_bytes(b"")
    assert f"needs the preload file (--hami-preload) at {absent}/preload" in refused(
        [*on_node, "--isolation", "hami-core", "--hami-library", str(library), "--hami-preload",
         f"{absent}/preload"], capsys)
    assert f"--isolation mps needs the MPS daemon's pipe folder {absent} (--mps-pipe-dir)" in refused(
        [*on_node, "--isolation", "mps", "--mps-pipe-dir", str(absent)], capsys)


@without_driver
def test_without_a_driver_the_plugin_process_says_so_in_one_json_line(local_cluster: LocalCluster,
                                                                      tmp_path: Path) -> None:
    """The whole command, as the DaemonSet runs it on a node without the NVIDIA driver: the sentence is a JSON
    log line like every other (it was plain text when the backend started before logging was set up), and the
    plugin publishes zero GPUs and keeps running."""
    kubeconfig = local_cluster.write_kubeconfig(tmp_path / "kubeconfig")
    with short_tmpdir() as plugin_dir, (tmp_path / "plugin.log").open("w+b") as log:
        plugin = subprocess.Popen([sys.executable, "-m", "deviceplugin", "--node-name", "node-0", "--kubeconfig",
                                   str(kubeconfig), "--backend", "nvml", "--device-plugin-dir", str(plugin_dir),
                                   "--pod-resources-socket", str(plugin_dir / "pod-resources.sock"),
                                   "--metrics-address", "127.0.0.1", "--metrics-port", "0"],
                                  stdout=log, stderr=subprocess.STDOUT)
        try:
            core: Any = client.CoreV1Api(local_cluster.api_client())
            eventually(lambda: plugin.poll() is not None
                       or core.read_node("node-0").status.capacity.get(RESOURCE_GPU_COUNT) == "0",
                       "the plugin publishing zero GPUs", timeout_s=30)
            assert plugin.poll() is None, (tmp_path / "plugin.log").read_text()
        finally:
            plugin.terminate()
            plugin.wait(timeout=10)
        log.seek(0)
        lines = log.read().decode().splitlines()
    entries = [json.loads(line) for line in lines]  # every line is JSON: none escaped the formatter
    driver = [e for e in entries if "driver" in e["msg"]]
    assert [(e["level"], e["logger"]) for e in driver] == [("WARNING", "deviceplugin.nvml")]
    assert driver[0]["msg"] == ("The NVIDIA driver is not installed on this node (NVML library not found), so it "
                                "advertises no GPUs; install the driver and restart the device plugin.")
    assert plugin.returncode == 0
