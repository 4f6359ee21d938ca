"""What every backend gives a task process, decided once: thread counts, device visibility, the summary line.

Backends call these; none of them decides any of it again.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from airflow_gpu_provider.settings import NVIDIA, GpuVendor, ResourceSettings
from airflow_gpu_provider.settings.accelerators import NO_GPUS, VENDORS
from airflow_gpu_provider.task.request import TaskRequest

THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")
# Indices mean what NVML and nvidia-smi say they mean (CUDA's own default orders by speed).
CUDA_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
# The NVIDIA container toolkit mounts the driver's libraries by capability: compute is CUDA, utility is NVML
# (libnvidia-ml.so.1, which the runtime's profile samples) and nvidia-smi.
DRIVER_CAPABILITIES = "compute,utility"
# The provider's device isolation: a task's own environment never overrides these.
ISOLATION = frozenset(
    {"NVIDIA_VISIBLE_DEVICES", *CUDA_ORDER, *(vendor.visible_devices_env for vendor in VENDORS.values())}
)


def with_user_environment(
    provider: Mapping[str, str], user: Mapping[str, str], vendor: GpuVendor = NVIDIA
) -> dict[str, str]:
    """The task's environment: the user's variables over the provider's defaults (threads, ...).

    Never the user's device isolation, though: which GPUs the task sees is the provider's to say. Where the provider
    leaves it to the platform (a GPU pod: the device plugin), the user's value is dropped too: a pod's own
    ``NVIDIA_VISIBLE_DEVICES=all`` could otherwise show it every GPU of the node.
    """
    enforced = ISOLATION | {vendor.visible_devices_env}
    return {**provider, **{name: value for name, value in user.items() if name not in enforced}}


def thread_environment(resources: ResourceSettings, processes: int = 1) -> dict[str, str]:
    """``OMP_NUM_THREADS`` & co., so that libraries do not start a thread per core of the host.

    Each of the ``processes`` that share the task's CPUs (a launch's ranks on one machine) gets its share:
    ``max(1, ceil(cpu_count) // processes)``.
    """
    if resources.cpu_count is None:
        return {}
    return dict.fromkeys(THREAD_VARIABLES, str(max(1, math.ceil(resources.cpu_count) // max(1, processes))))


def visible_devices(vendor: GpuVendor, device_ids: Sequence[str]) -> dict[str, str]:
    """The variables that restrict a process to ``device_ids`` (none visible for an empty list)."""
    environment = {vendor.visible_devices_env: ",".join(device_ids)}
    if vendor == NVIDIA:
        environment.update(CUDA_ORDER)
    return environment


def driver_environment(resources: ResourceSettings) -> dict[str, str]:
    """For a container or pod with NVIDIA GPUs: the driver's CUDA and NVML libraries (:data:`DRIVER_CAPABILITIES`)."""
    wanted = resources.requests_gpus and resources.gpu_vendor == NVIDIA
    return {"NVIDIA_DRIVER_CAPABILITIES": DRIVER_CAPABILITIES} if wanted else {}


def gpu_free_environment(resources: ResourceSettings) -> dict[str, str]:
    """For a container or pod that asked for no GPU: keep it off the host's GPUs."""
    return {} if resources.requests_gpus else dict(NO_GPUS)


def lock_holder(request: TaskRequest, backend: str) -> str:
    """Who holds a GPU lock, as busy-GPU messages name it: ``dag.task run <run_id> (<backend>)``."""
    return f"{request.display_name} run {request.labels.get('run_id', '?')} ({backend})"
