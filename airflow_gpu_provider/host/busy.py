"""The GPUs of a host in words, for the messages of a task that cannot have them: who holds which, what helps."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_gpu_provider.host.locks import held_now
from airflow_gpu_provider.host.shares import free_parts
from airflow_gpu_provider.settings.shares import SHARE_PARTS
from airflow_gpu_provider.task.missing_gpu import MissingGpuPolicy

if TYPE_CHECKING:
    from airflow_gpu_provider.host.inventory import Device


def describe(
    holder_of: Callable[[Device], str | None],
    lock_path: Callable[[Device], Path],
    present: Sequence[Device],
    candidates: Sequence[Device],
    share: bool,
) -> str:
    """What the host has, which of it matches, and who holds it (for a share: each GPU's unpromised part).

    :param holder_of: who holds a device (``GpuAllocator.holder_of``); ``lock_path``: its lock file
    """
    if not present:
        return "this host has no GPUs (none found by NVML and none listed in [gpu] devices)"
    busy = {d.id: holder_of(d) for d in candidates}
    parts = [f"this host has {len(present)} GPU(s) ({', '.join(d.name or d.id for d in present)})"]
    if len(candidates) != len(present):
        parts.append(f"{len(candidates)} of them match the request and are usable")
    if share:
        held = held_now()
        free = {d.id: free_parts(lock_path(d), held) * 100 // SHARE_PARTS for d in candidates}
        parts.append("unpromised: " + ", ".join(f"{device_id} {pct} %" for device_id, pct in free.items()))
    else:
        parts.append(f"free: {', '.join(device_id for device_id, who in busy.items() if not who) or 'none'}")
    taken = [f"{device_id} held by {who}" for device_id, who in busy.items() if who]
    parts += [f"busy: {'; '.join(taken)}"] if taken else []
    return ", ".join(parts)


def what_helps(matching: int, count: int, rule: MissingGpuPolicy, *, share: bool = False) -> str:
    """What the task's author can do on this host: waiting helps only where enough GPUs exist and are busy."""
    if matching >= count:
        return "Set on_missing_gpu='wait' to wait for the busy GPUs, or on_missing_gpu='cpu' to run on CPU."
    if share:
        return (
            "No GPU of this host can hold the share: it is larger than each, or their memory is unknown (NVML tells "
            "it; else list the models in [gpu] devices: 0=L4,1=A100-80GB). Ask for less, or a fraction: gpu_count=0.25."
        )
    never = "Waiting cannot help: the host does not have that many. " if rule.waits else ""
    return (
        f"{never}Set on_missing_gpu='cpu' to run on CPU, run the task where there are GPUs (a GPU worker's queue, "
        "the Docker or Kubernetes backend), or list this host's GPUs in [gpu] devices."
    )


def left_out(requested: str, quarantined: Sequence[str], state: str) -> str:
    """Why a request fails that the host's GPUs could meet, were some not left out after a fault of their own."""
    return (
        f"Requested {requested} but {'; '.join(quarantined)}, left out after a fault of the GPU itself "
        f"([gpu] quarantine_seconds); {state}. It comes back by itself then: run the task later or on "
        "another host, or set on_missing_gpu='cpu' to run on CPU."
    )
