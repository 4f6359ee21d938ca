"""ResourceSettings -> the container's host config and environment. Pure: no client, no I/O.

The values are keyword arguments of docker-py's ``APIClient.create_host_config`` (plain dicts and lists, which
docker-py turns into ``DeviceRequest`` / ``Ulimit`` objects), so tests compare them as data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_gpu_provider.backends.docker.options import DockerOptions, check_gpu_request
from airflow_gpu_provider.settings import ALL_GPUS, AMD, NVIDIA, ResourceSettings
from airflow_gpu_provider.task.environment import CUDA_ORDER, gpu_free_environment, thread_environment, visible_devices

# NVIDIA's recommendation for PyTorch in containers: unlimited locked memory, a 64 MiB stack.
NVIDIA_ULIMITS: tuple[dict[str, Any], ...] = (
    {"name": "memlock", "soft": -1, "hard": -1},
    {"name": "stack", "soft": 67108864, "hard": 67108864},
)
AMD_DEVICES: tuple[str, ...] = ("/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm")
INTEL_DEVICES: tuple[str, ...] = ("/dev/dri:/dev/dri:rwm",)


@dataclass(frozen=True)
class ContainerResources:
    """What one resource request becomes on Docker.

    :param host_config: keyword arguments of ``APIClient.create_host_config``
    :param environment: variables the container needs for those resources
    :param notes: things the mapping could not express, for the task log
    """

    host_config: dict[str, Any]
    environment: dict[str, str]
    notes: tuple[str, ...] = field(default=())


def gpu_mapping(
    resources: ResourceSettings,
    *,
    device_ids: Sequence[str] = (),
    driver_capabilities: str = DockerOptions.driver_capabilities,
    device_groups: Sequence[str] = (),
) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """Host config, environment and notes for the accelerators of a request (empty for a CPU task).

    :param device_ids: GPU indices or UUIDs to request instead of a count (MIG slices need their UUIDs)
    :param device_groups: the host's gids of the groups that own AMD's device nodes (``video``, ``render``)
    """
    count = 1 if resources.share is not None else resources.gpu_count  # a share: the one GPU the allocator gave
    vendor = resources.gpu_vendor
    if not resources.requests_gpus:
        return {}, gpu_free_environment(resources), []
    check_gpu_request(resources, device_ids)
    notes = []
    if resources.accelerator:
        notes.append(
            f"accelerator={resources.accelerator!r} is not checked by Docker: the engine hands out whichever GPUs "
            "it has; run the task on a host with that model (or list its devices in backend_options devices)."
        )
    ids = list(device_ids) if count == ALL_GPUS else list(device_ids)[: int(count)]
    environment: dict[str, str] = {}
    if vendor == NVIDIA:
        request: dict[str, Any] = {"driver": "", "capabilities": [["gpu"]]}
        if ids:
            request["device_ids"] = ids
        else:
            request["count"] = -1 if count == ALL_GPUS else int(count)
        host_config: dict[str, Any] = {"device_requests": [request], "ulimits": [dict(u) for u in NVIDIA_ULIMITS]}
        environment["NVIDIA_DRIVER_CAPABILITIES"] = driver_capabilities
        environment.update(CUDA_ORDER)  # NVIDIA_VISIBLE_DEVICES is set by the engine from the device request
        return host_config, environment, notes
    if vendor == AMD:
        host_config = {"devices": list(AMD_DEVICES), "group_add": list(device_groups)}
    else:
        host_config = {"devices": list(INTEL_DEVICES)}
    # /dev/dri exposes every card: the runtime's visible-devices variable narrows it to the request.
    if ids or count != ALL_GPUS:
        environment.update(visible_devices(vendor, ids or [str(i) for i in range(int(count))]))
    return host_config, environment, notes


def map_resources(
    resources: ResourceSettings,
    *,
    shm_size: int,
    ipc_mode: str | None = None,
    device_ids: Sequence[str] = (),
    driver_capabilities: str = DockerOptions.driver_capabilities,
    group_add: Sequence[str] = (),
    device_groups: Sequence[str] = (),
    processes: int = 1,
) -> ContainerResources:
    """The Docker form of a resource request.

    :param shm_size: ``/dev/shm`` bytes when ``resources.shm_size`` is unset (capped at the memory limit)
    :param ipc_mode: Docker IPC mode; with ``"host"`` the host's ``/dev/shm`` is used and no size is set
    :param group_add: the task's supplementary groups (gids), whatever its devices: added to the device groups
    :param processes: the processes that share the CPUs (a launch's ranks): each gets its share of threads
    """
    host_config, environment, notes = gpu_mapping(
        resources, device_ids=device_ids, driver_capabilities=driver_capabilities, device_groups=device_groups
    )
    groups = list(dict.fromkeys([*host_config.pop("group_add", ()), *group_add]))
    if groups:
        host_config["group_add"] = groups
    if resources.cpu_count is not None:
        host_config["nano_cpus"] = round(resources.cpu_count * 1e9)
    environment.update(thread_environment(resources, processes))
    if resources.memory is not None:
        host_config["mem_limit"] = resources.memory
        host_config["memswap_limit"] = resources.memory  # a hard limit: no swap, so running out is an OOM kill
    if ipc_mode is not None:
        host_config["ipc_mode"] = ipc_mode
    if ipc_mode != "host":
        shm = resources.shm_size if resources.shm_size is not None else shm_size
        if resources.shm_size is None and resources.memory is not None:
            shm = min(shm, resources.memory)  # /dev/shm pages count against the memory limit
        host_config["shm_size"] = shm
    host_config["privileged"] = False
    return ContainerResources(host_config, environment, tuple(notes))
