"""Hostile input against a running device plugin: Allocate and GetPreferredAllocation over its real unix
socket, its cluster file, and its control file.

Every hostile call must be answered quickly with a status code and a sentence that names the cause, must leave
the pod it could have touched exactly as it was (read back through the local API server), and must leave the
plugin serving: after each case the pod gets a valid Allocate. The kubelet is paused throughout, so the tests
are the only ones calling the plugin.
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_kubelet import NODE, UUIDS, Rig, eventually, rig

from deviceplugin.__main__ import main
from deviceplugin.plugin import SOCKET_NAME
from gpushare.contract import ANN_ALLOCATED_CONTAINERS, ANN_ASSIGNED
from gpushare.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from gpushare.kubeletapi import deviceplugin_v1beta1_pb2_grpc as rpc

# What the tests require of every answer, generous for a loaded CI machine; the measured times are printed.
ANSWER_BOUND_S = 0.5
# The longest status message a hostile call may produce: the kubelet copies it into the pod's status.
MESSAGE_BOUND = 1200
INVALID = grpc.StatusCode.INVALID_ARGUMENT
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
UNHEALTHY_GPU = 1


def dev(gpu: int, n: int) -> str:
    return f"{UUIDS[gpu]}-_-{n}"


def devs(gpu: int, start: int, count: int) -> list[str]:
    return [dev(gpu, n) for n in range(start, start + count)]


@dataclass
class Hostile:
    node: Rig
    stub: rpc.DevicePluginStub
    timings: dict[str, float] = field(default_factory=dict)

    def timed(self, case: str, call: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        try:
            return call()
        finally:
            elapsed = time.perf_counter() - started
            self.timings[case] = elapsed
            assert elapsed < ANSWER_BOUND_S, f"{case} took {elapsed * 1000:.1f} ms"

    def allocate(self, *containers: list[str]) -> pb.AllocateResponse:
        return self.stub.Allocate(pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=ids) for ids in containers]), timeout=5)

    def preferred(self, *containers: tuple[list[str], list[str], int]) -> pb.PreferredAllocationResponse:
        return self.stub.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[
            pb.ContainerPreferredAllocationRequest(available_deviceIDs=available, must_include_deviceIDs=must,
                                                   allocation_size=size)
            for available, must, size in containers]), timeout=5)

    def delete(self, name: str) -> None:
        self.node.core.delete_namespaced_pod(name, "default", grace_period_seconds=0, _preload_content=False)


@pytest.fixture(scope="module")
def hostile() -> Iterator[Hostile]:
    with rig() as node, node.kubelet.paused(), \
            grpc.insecure_channel(f"unix://{node.directory / SOCKET_NAME}") as channel:
        with (node.directory / "control.jsonl").open("a") as control:
            control.write(json.dumps({"gpu": UNHEALTHY_GPU, "xid": 79}) + "\n")
        eventually(lambda: not node.plugin.inventory.healthy(UNHEALTHY_GPU), "GPU 1 Unhealthy")
        state = Hostile(node, rpc.DevicePluginStub(channel))
        # A pod whose only container already got its devices: a repeated Allocate of its size must say so.
        node.create("done", {"c": 3})
        node.place("done", (0,))
        state.allocate(devs(0, 0, 3))
        try:
            yield state
        finally:
            state.delete("done")
            eventually(lambda: node.plugin.cache.get("default/done") is None, "the plugin forgetting the pods")
    if state.timings:
        times = sorted(state.timings.values())
        print(f"\nhostile device plugin calls: {len(times)} answered, max {times[-1] * 1000:.1f} ms, "
              f"median {statistics.median(times) * 1000:.1f} ms, slowest {max(state.timings, key=state.timings.get)}")


@dataclass(frozen=True)
class Case:
    name: str
    call: Callable[[Hostile], object]
    code: grpc.StatusCode
    says: tuple[str, ...]
    containers: dict[str, int] = field(default_factory=lambda: {"c": 2})
    """The waiting pod's GPU containers; after the case they get a valid Allocate (devices of GPU 0)."""
    rogue: bool = False
    """Also bind a 5-unit pod that bypassed the extender, as a pod started by another scheduler would be."""


def alloc(*containers: list[str]) -> Callable[[Hostile], object]:
    return lambda h: h.allocate(*containers)


def pref(*containers: tuple[list[str], list[str], int]) -> Callable[[Hostile], object]:
    return lambda h: h.preferred(*containers)


HUGE = "GPU-" + "x" * 10_000 + "-_-0"
GPU0 = devs(0, 0, 16)
CASES = [
    Case("allocate with no container requests", alloc(), INVALID, ("container_requests is empty",)),
    Case("allocate a container with no devices", alloc([]), INVALID, ("devices_ids is empty",)),
    Case("allocate a foreign device ID", alloc(["nvidia0"]), INVALID, ("'nvidia0', which is not a gpushare device",)),
    Case("allocate a device of a GPU the node lacks", alloc(["GPU-nope-_-0"]), INVALID,
         ("names GPU 'GPU-nope', which this node does not have",)),
    Case("allocate a unit past the end of a GPU", alloc([dev(0, 999)]), INVALID,
         ("but GPU 0 advertises 16 device(s), numbered 0 to 15",)),
    Case("allocate the unit just past the end", alloc([dev(0, 16), dev(0, 15)]), INVALID, ("numbered 0 to 15",)),
    Case("allocate a negative unit", alloc([f"{UUIDS[0]}-_--1"]), INVALID, ("not a gpushare device ID",)),
    Case("allocate a unit with a leading zero", alloc([f"{UUIDS[0]}-_-01", dev(0, 2)]), INVALID,
         ("not a gpushare device ID",)),
    Case("allocate a unit in non-ASCII digits", alloc([f"{UUIDS[0]}-_-\u00b2", dev(0, 2)]), INVALID,
         ("not a gpushare device ID",)),
    Case("allocate one device four times", alloc([dev(0, 5)] * 4), INVALID,
         (f"names device '{dev(0, 5)}' more than once",)),
    Case("allocate one device to two containers", alloc(devs(0, 4, 2), devs(0, 5, 2)), INVALID,
         ("is in container requests 1 and 2 of one Allocate call",)),
    Case("allocate a 10 kB device ID", alloc([HUGE, dev(0, 1)]), INVALID, ("...', which names GPU 'GPU-xxx",)),
    Case("allocate an ID with control characters", alloc(["GPU-\n\x00-_-0", dev(0, 1)]), INVALID,
         ("'GPU-\\n\\x00-_-0'",)),
    Case("allocate more IDs than the node advertises", alloc([f"x{i}" for i in range(73)]), INVALID,
         ("holds 73 device IDs, more than the 72 this node advertises",)),
    Case("allocate devices of an Unhealthy GPU", alloc(devs(UNHEALTHY_GPU, 0, 2)), PRECONDITION,
         ("a device of GPU 1, which is Unhealthy after a critical XID",)),
    Case("allocate a size no pod waits for", alloc(devs(0, 4, 7)), PRECONDITION,
         ("waiting for a container of 7 unit(s)", "wait for other sizes", "(c: 2)")),
    Case("allocate again for a container that got its devices", alloc(devs(0, 0, 3)), PRECONDITION,
         ("container c of pod default/done already got its 3 unit(s) on GPU(s) 0; this device plugin recorded it at",
          "lost its record of the devices")),
    Case("allocate two containers whose second matches nothing", alloc(devs(0, 4, 4), devs(0, 8, 3)), PRECONDITION,
         ("containers of 4 and 3 unit(s)", "(train: 4, side: 2)"), containers={"train": 4, "side": 2}),
    Case("allocate two containers for a one-container pod", alloc(devs(0, 4, 2), devs(0, 6, 2)), PRECONDITION,
         ("containers of 2 and 2 unit(s)",)),
    Case("allocate for a pod that bypassed the extender", alloc(devs(2, 0, 5)), PRECONDITION,
         ("not placed by the gpushare scheduler extender", "rogue-", "schedulerName"), rogue=True),
    Case("prefer size 0", pref((GPU0, [], 0)), INVALID, ("allocation_size is 0; it must be at least 1",)),
    Case("prefer size -1", pref((GPU0, [], -1)), INVALID, ("allocation_size is -1",)),
    Case("prefer more than is available", pref((devs(0, 0, 3), [], 4)), EXHAUSTED,
         ("allocation_size is 4, but available_deviceIDs offers only 3",)),
    Case("prefer the largest size", pref((GPU0, [], 2**31 - 1)), EXHAUSTED, ("offers only 16",)),
    Case("prefer with a must-include that is not available", pref((devs(0, 0, 4), [dev(0, 9)], 2)), INVALID,
         (f"must_include_deviceIDs holds '{dev(0, 9)}', not in available_deviceIDs",)),
    Case("prefer with more must-includes than the size", pref((GPU0, devs(0, 0, 3), 2)), INVALID,
         ("holds 3 devices, more than allocation_size (2)",)),
    Case("prefer from a foreign ID", pref((["nvidia0", *devs(0, 0, 3)], [], 2)), INVALID,
         ("available_deviceIDs holds 'nvidia0'",)),
    Case("prefer from a repeated ID", pref(([dev(0, 1)] * 3, [], 2)), INVALID, ("more than once",)),
    Case("prefer from a unit past the end", pref(([dev(2, 40), dev(2, 0)], [], 1)), INVALID,
         ("GPU 2 advertises 40 device(s)",)),
    Case("prefer from an Unhealthy GPU only", pref((devs(UNHEALTHY_GPU, 0, 4), [], 2)), EXHAUSTED,
         ("only 0 of the 4 devices in available_deviceIDs are on Healthy GPUs",)),
    Case("prefer with a bad second container request", pref((GPU0, [], 2), (GPU0, [], 0)), INVALID,
         ("allocation_size of container request 2 is 0",)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_hostile_call_is_refused_quickly_with_its_cause_and_changes_nothing(hostile: Hostile, case: Case) -> None:
    node = hostile.node
    victim = f"victim-{CASES.index(case)}"
    node.create(victim, case.containers)
    node.place(victim, (0,))
    rogue = f"rogue-{CASES.index(case)}"
    if case.rogue:
        node.create(rogue, {"c": 5})
        node.bind(rogue)
    eventually(lambda: all(node.plugin.cache.get(f"default/{name}") is not None
                           for name in (victim, *([rogue] if case.rogue else []))), "the plugin seeing the pods")
    before = node.pod(victim)["metadata"]

    with pytest.raises(grpc.RpcError) as caught:
        hostile.timed(case.name, lambda: case.call(hostile))

    error = caught.value
    assert error.code() == case.code, error.details()
    details = error.details() or ""
    for phrase in case.says:
        assert phrase in details
    assert len(details) < MESSAGE_BOUND and "\n" not in details
    after = node.pod(victim)["metadata"]
    assert (after["resourceVersion"], after["annotations"]) == (before["resourceVersion"], before["annotations"])
    # Still serving: the waiting pod gets all its containers in one valid call.
    sizes = list(case.containers.values())
    starts = [4 + sum(sizes[:i]) for i in range(len(sizes))]
    served = hostile.allocate(*(devs(0, start, units) for start, units in zip(starts, sizes, strict=True)))
    assert [r.envs["ALIYUN_COM_GPU_MEM_CONTAINER"] for r in served.container_responses] == [str(s) for s in sizes]
    annotations = node.pod(victim)["metadata"]["annotations"]
    assert annotations[ANN_ASSIGNED] == "true"
    if len(sizes) > 1:
        assert annotations[ANN_ALLOCATED_CONTAINERS] == ",".join(case.containers)
    hostile.delete(victim)
    if case.rogue:
        hostile.delete(rogue)


def test_the_cases_cover_every_kind_of_refusal() -> None:
    assert len(CASES) >= 25
    assert {c.code for c in CASES} == {INVALID, PRECONDITION, EXHAUSTED}


# GetPreferredAllocation, for any arguments at all


POOL = [*devs(0, 0, 16), *devs(UNHEALTHY_GPU, 0, 4), *devs(2, 30, 10), "nvidia0", dev(0, 16), ""]


@settings(max_examples=150, deadline=None)
@given(available=st.lists(st.sampled_from(POOL), max_size=30), must=st.lists(st.sampled_from(POOL), max_size=4),
       size=st.integers(min_value=-2, max_value=35))
def test_a_preference_stays_within_what_was_offered(hostile: Hostile, available: list[str], must: list[str],
                                                     size: int) -> None:
    try:
        response = hostile.preferred((available, must, size))
    except grpc.RpcError as error:
        assert error.code() in (INVALID, EXHAUSTED), error.details()
        assert error.details() and len(error.details()) < MESSAGE_BOUND
        valid = (len(set(available)) == len(available) and set(available) <= set(POOL[:-3])
                 and len(set(must)) == len(must) and set(must) <= set(available) and len(must) <= size)
        healthy = {d for d in available if not d.startswith(UUIDS[UNHEALTHY_GPU])} | set(must)
        assert not (valid and 0 < size <= len(healthy)), f"a valid request was refused: {error.details()}"
        return
    chosen = list(response.container_responses[0].deviceIDs)
    assert set(chosen) <= set(available) and set(must) <= set(chosen)
    assert len(chosen) == len(set(chosen)) == size


# The cluster file


CLUSTER_FILES = {
    "not UTF-8": (b"nodes: [{name: \xff}]\n", "is not UTF-8 text (byte 0xff at offset 15); save it as UTF-8"),
    "not YAML": (b"nodes: [\n", "is not valid YAML at line 2, column 1"),
    "a list": (b"- gpu-node\n", "holds a YAML list at its top level; it must be a mapping"),
    "wrong field": (b"nodes: [{name: gpu-node, gpus: [{model: T4, memoryMiB: -5}]}]\n",
                    "is invalid at nodes.0.gpus.0.memoryMiB: Input should be greater than 0"),
    "a folder": (None, "Cannot read the cluster description"),
}


@pytest.mark.parametrize("problem", list(CLUSTER_FILES))
def test_a_bad_cluster_file_stops_the_plugin_with_one_sentence(problem: str, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    content, says = CLUSTER_FILES[problem]
    path = tmp_path / "cluster.yaml"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    started = time.perf_counter()
    with pytest.raises(SystemExit) as caught:
        main(["--node-name", NODE, "--backend", "simulated", "--cluster", str(path)])
    elapsed = time.perf_counter() - started
    err = capsys.readouterr().err
    assert caught.value.code == 2 and elapsed < ANSWER_BOUND_S
    assert err.startswith("gpushare-device-plugin: ") and str(path) in err and says in err
    assert err.count("\n") == 1 and "Traceback" not in err


# The control file


BAD_LINES = {
    "1e400": b'{"gpu": 0, "xid": 1e400}',
    "not UTF-8": b'{"gpu": 0, "xid": 79, "\xff": 1}',
    "not JSON": b"xid 79 on gpu 0",
    "a list": b"[0, 79]",
    "a GPU the node lacks": b'{"gpu": 99, "xid": 79}',
    "a negative GPU": b'{"gpu": -1, "xid": 79}',
    "true as a GPU": b'{"gpu": true, "xid": 79}',
    "a fractional GPU": b'{"gpu": 0.5, "xid": 79}',
    "an unknown key": b'{"gpu": 0, "xid": 79, "note": "x"}',
    "xid and usedMiB": b'{"gpu": 0, "xid": 79, "usedMiB": 1}',
    "more memory than the GPU has": b'{"gpu": 0, "usedMiB": 99999999}',
    "a 5 kB line": b'{"gpu": 0, "xid": 79, "pad": "' + b"x" * 5000 + b'"}',
    "deep nesting": b"[" * 4000,
    "a 100 kB line": b"[" * 100_000,
}


@pytest.mark.parametrize("problem", list(BAD_LINES))
def test_a_bad_control_line_is_skipped_by_number_and_the_follower_goes_on(
        hostile: Hostile, problem: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="deviceplugin")
    node = hostile.node
    control = node.directory / "control.jsonl"
    line = control.read_bytes().count(b"\n") + 1

    def sentinels() -> float:
        return node.plugin.registry.get_sample_value("gpushare_gpu_xid_events_total",
                                                     {"gpu": "2", "xid": "43"}) or 0.0

    seen = sentinels()
    with control.open("ab") as handle:  # an application XID after the bad line: counted, health unchanged
        handle.write(BAD_LINES[problem] + b"\n" + json.dumps({"gpu": 2, "xid": 43}).encode() + b"\n")
    eventually(lambda: sentinels() == seen + 1, "the line after the bad one")
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"Skipping line {line} of")]
    assert len(warnings) == 1 and len(warnings[0]) < 500, warnings
    for gpu in ("99", "-1"):
        assert node.plugin.registry.get_sample_value("gpushare_gpu_xid_events_total", {"gpu": gpu, "xid": "79"}) \
            is None
    assert node.plugin.inventory.healthy(0) and node.plugin.inventory.healthy(2)
