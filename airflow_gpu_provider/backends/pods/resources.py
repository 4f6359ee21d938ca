"""``ResourceSettings`` -> container requests/limits and the ``/dev/shm`` volume, as Kubernetes API dicts.

Rules:

- the accelerator is the vendor's extended resource (``nvidia.com/gpu``, ``amd.com/gpu``, ``gpu.intel.com/i915``,
  ``aws.amazon.com/neuron``, ``google.com/tpu``), or ``nvidia.com/mig-<profile>`` for a MIG slice; extended resources
  cannot be overcommitted, so requests equal limits;
- cpu and memory: requests equal limits too, so a GPU pod gets the ``Guaranteed`` QoS class and is the last to be
  evicted;
- ``gpu_count="all"`` has no Kubernetes form (a pod asks for a number): the registry refuses it for this backend.
"""

from __future__ import annotations

from typing import Any

from airflow_gpu_provider.settings import ResourceSettings
from airflow_gpu_provider.settings.units import format_k8s_bytes, format_k8s_cpu

SHM_VOLUME = "dshm"
SHM_PATH = "/dev/shm"


def accelerator_resource(resources: ResourceSettings) -> str | None:
    """The extended resource name the task asks for, or None without accelerators."""
    if not resources.requests_gpus:
        return None
    if resources.mig_profile is not None:
        return f"nvidia.com/mig-{resources.mig_profile}"
    return resources.gpu_vendor.k8s_resource


def container_resources(resources: ResourceSettings) -> dict[str, dict[str, str]]:
    """``{"requests": {...}, "limits": {...}}`` for the main container (empty dicts when nothing is set)."""
    amounts: dict[str, str] = {}
    if resources.cpu_count is not None:
        amounts["cpu"] = format_k8s_cpu(resources.cpu_count)
    if resources.memory is not None:
        amounts["memory"] = format_k8s_bytes(resources.memory)
    key = accelerator_resource(resources)
    if key is not None:
        amounts[key] = str(resources.gpu_count)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def without_accelerators(requirements: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """The cpu/memory part only (for init containers, which must not hold GPUs)."""
    return {
        kind: {k: v for k, v in amounts.items() if k in ("cpu", "memory")} for kind, amounts in requirements.items()
    }


def shm_volume(resources: ResourceSettings) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(volumes, volume_mounts)`` for a memory-backed ``/dev/shm`` of ``shm_size`` (none when unset or 0).

    The kubelet counts the pages written there against the container's memory limit.
    """
    if not resources.shm_size:
        return [], []
    volume = {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": format_k8s_bytes(resources.shm_size)}}
    return [volume], [{"name": SHM_VOLUME, "mountPath": SHM_PATH}]
