"""What a container receives at Allocate: Aliyun's environment, plus the settings of the isolation layer.

* ``none``: the GPU(s) and Aliyun's variables only; the share is a promise between pods.
* ``hami-core``: HAMi's libvgpu.so is preloaded into the container and caps each visible GPU's memory
  (``CUDA_DEVICE_MEMORY_LIMIT_<i>``, ``i`` the CUDA ordinal in the container) and, when the pod has a compute
  ceiling, its SMs (``CUDA_DEVICE_SM_LIMIT``).
* ``mps``: the container is an MPS client of the node's MPS daemon, which pins its memory per device
  (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``) and, with a compute ceiling, its threads.

Both compute settings are ceilings, so the container gets the pod's compute *limit*
(``gpushare.io/gpu-compute-limit``, the guaranteed share when absent). Neither layer reserves a floor: the
guaranteed share holds because the extender keeps the shares of each GPU's pods at 100% or less.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum

from gpushare.contract import ANN_DEV, ANN_IDX, ANN_POD, ENV_CONTAINER

HAMI_LIBRARY_IN_CONTAINER = "/usr/local/vgpu/libvgpu.so"
PRELOAD_IN_CONTAINER = "/etc/ld.so.preload"


class Isolation(StrEnum):
    NONE = "none"
    HAMI_CORE = "hami-core"
    MPS = "mps"


@dataclass(frozen=True)
class IsolationConfig:
    mode: Isolation = Isolation.NONE
    hami_library: str = HAMI_LIBRARY_IN_CONTAINER
    hami_preload: str = "/usr/local/vgpu/ld.so.preload"
    mps_pipe_dir: str = "/tmp/nvidia-mps"
    # The daemon's shared memory, which its clients map: the host's /dev/shm for a daemon in the host's IPC
    # namespace (the chart's). "" mounts none, for a daemon whose clients share its IPC namespace otherwise.
    mps_shm_dir: str = "/dev/shm"


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = True


@dataclass(frozen=True)
class ContainerGrant:
    """One container's GPUs and share, as decided at Allocate."""

    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    container_units: int
    pod_units: int
    gpu_units: int
    limit_mib: tuple[int, ...]
    """The container's memory cap on each of its GPUs, in CUDA ordinal order."""
    compute_limit: int = 0
    """The ceiling on each GPU's SMs, in percent; 0 for none."""


def container_environment(grant: ContainerGrant, config: IsolationConfig) -> tuple[dict[str, str], list[Mount]]:
    env = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(grant.gpu_uuids),
        ANN_IDX: ",".join(str(i) for i in grant.gpu_indices),
        ANN_POD: str(grant.pod_units),
        ENV_CONTAINER: str(grant.container_units),
        ANN_DEV: str(grant.gpu_units),
    }
    mounts: list[Mount] = []
    if config.mode is Isolation.HAMI_CORE:
        for ordinal, mib in enumerate(grant.limit_mib):
            env[f"CUDA_DEVICE_MEMORY_LIMIT_{ordinal}"] = f"{mib}m"
        if grant.compute_limit:
            env["CUDA_DEVICE_SM_LIMIT"] = str(grant.compute_limit)
        mounts += [Mount(HAMI_LIBRARY_IN_CONTAINER, config.hami_library),
                   Mount(PRELOAD_IN_CONTAINER, config.hami_preload)]
    elif config.mode is Isolation.MPS:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{i}={mib}M" for i, mib in enumerate(grant.limit_mib))
        if grant.compute_limit:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(grant.compute_limit)
        env["CUDA_MPS_PIPE_DIRECTORY"] = config.mps_pipe_dir
        mounts.append(Mount(config.mps_pipe_dir, config.mps_pipe_dir, read_only=False))
        if config.mps_shm_dir:
            mounts.append(Mount("/dev/shm", config.mps_shm_dir, read_only=False))
    return env, mounts


def missing_files(config: IsolationConfig) -> str | None:
    """Why the isolation mode cannot work on this node, when what it mounts into containers is not here.

    The plugin sees the host paths it hands to the kubelet (the chart mounts them at the same paths): a
    container started without them would run unisolated (hami-core) or fail at its first CUDA call (mps).
    """
    if config.mode is Isolation.HAMI_CORE:
        for path, what in ((config.hami_library, "HAMi-core's library (--hami-library)"),
                           (config.hami_preload, "the preload file (--hami-preload)")):
            if not os.path.isfile(path):
                return (f"--isolation hami-core needs {what} at {path}, and there is no file there; install "
                        "HAMi-core on the node (the chart's install-hami-core init container does) or fix the path.")
    elif config.mode is Isolation.MPS and not os.path.isdir(config.mps_pipe_dir):
        return (f"--isolation mps needs the MPS daemon's pipe folder {config.mps_pipe_dir} (--mps-pipe-dir), and "
                "there is no folder there; start nvidia-cuda-mps-control -f on the node (the chart's "
                "devicePlugin.mps.controlDaemon.enabled) or fix the path.")
    return None
