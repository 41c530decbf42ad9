"""Concurrent binds never overcommit a GPU, and a restarted extender rebuilds the same state from annotations."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client
from test_extender_harness import create_pod, gpu_node, pod_body, running_extender, spec, wait_for

from gpushare.contract import MemoryUnit, read_assignment
from gpushare.kube.convert import pod_info
from gpushare.localcluster import LocalCluster

GPU_SIZES_MIB = [8192, 15360, 16384, 32768]

clusters = st.lists(st.lists(st.sampled_from(GPU_SIZES_MIB), min_size=1, max_size=4), min_size=1, max_size=3)
pods = st.lists(st.tuples(st.integers(1, 16), st.integers(1, 2), st.integers(0, 2)), min_size=2, max_size=14)


def bind_all(url: str, created: list[dict[str, Any]], targets: list[str]) -> list[str]:
    """POST every bind at once from 8 threads, each after its filter as kube-scheduler sends it; the Errors."""
    for pod, node in zip(created, targets, strict=True):
        httpx.post(url + "/gpushare-scheduler/filter", content=orjson.dumps({"Pod": pod, "NodeNames": [node]}))

    def bind(item: tuple[dict[str, Any], str]) -> str:
        pod, node = item
        response = httpx.post(url + "/gpushare-scheduler/bind", timeout=30, content=orjson.dumps(
            {"PodName": pod["metadata"]["name"], "PodNamespace": "default", "PodUID": pod["metadata"]["uid"],
             "Node": node}))
        assert response.status_code == 200
        return str(response.json()["Error"])

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(bind, zip(created, targets, strict=True)))


def reservations(url: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("gpushare_extender_reservations "):
            return float(line.split()[1])
    raise AssertionError("no reservations gauge")


def settled_inspect(url: str) -> Any:
    wait_for(lambda: reservations(url) == 0, "the watch to confirm every bind")
    return httpx.get(url + "/gpushare-scheduler/inspect").json()


@settings(max_examples=15, deadline=None)
@given(clusters, pods, st.integers(0, 14))
def test_concurrent_binds_never_overcommit_and_restart_rebuilds(gpu_sizes: list[list[int]],
                                                                 wanted: list[tuple[int, int, int]],
                                                                 restart_at: int) -> None:
    names = [f"n{i}" for i in range(len(gpu_sizes))]
    local = spec(*(gpu_node(name, *[("Tesla-T4", mib) for mib in sizes]) for name, sizes in zip(names, gpu_sizes,
                                                                                               strict=True)))
    totals = {(name, i): MemoryUnit.GiB.from_mib(mib) for name, sizes in zip(names, gpu_sizes, strict=True)
              for i, mib in enumerate(sizes)}
    restart_at = min(restart_at, len(wanted))
    with LocalCluster(local) as cluster:
        core = client.CoreV1Api(cluster.api_client())
        created = [create_pod(core, pod_body(f"p{i}", per_gpu * count, gpu_count=count if count > 1 else 0))
                   for i, (per_gpu, count, _) in enumerate(wanted)]
        targets = [names[node % len(names)] for _, _, node in wanted]
        with running_extender(cluster) as url:
            errors = bind_all(url, created[:restart_at], targets[:restart_at])
            before = settled_inspect(url)
        with running_extender(cluster) as url:
            assert httpx.get(url + "/gpushare-scheduler/inspect").json() == before
            errors += bind_all(url, created[restart_at:], targets[restart_at:])
            after = settled_inspect(url)

        listed: Any = core.list_namespaced_pod("default", _preload_content=False)
        stored = {p["metadata"]["name"]: p for p in orjson.loads(listed.data)["items"]}
        used = dict.fromkeys(totals, 0)
        for pod, node, error in zip(created, targets, errors, strict=True):
            info = pod_info(stored[pod["metadata"]["name"]])
            assignment = read_assignment(info)
            if error:
                # Taken by a concurrent bind since filter, or never fitting, so filter did not pass the node.
                assert "the pod no longer fits" in error or "did not pass node" in error
                assert assignment is None and info.node_name is None
                continue
            assert assignment is not None and info.node_name == node
            for index in assignment.gpu_indices:
                used[(node, index)] += assignment.per_gpu
        assert all(used[gpu] <= totals[gpu] for gpu in totals), f"overcommitted: {used} of {totals}"
        assert {(n["name"], d["id"]): d["usedGPU"] for n in after["nodes"] for d in n["devs"]} == used
