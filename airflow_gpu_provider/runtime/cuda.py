"""CUDA helpers: the cache a task leaves, its memory, the GPUs this process sees. Standard library only.

The one implementation of each, run by the runtime in the task process and, in the worker's own process, by
``CudaHook`` and the host's GPU inventory (the one module of the runtime the worker imports besides the protocol).
torch, nvidia-ml-py and ``nvidia-smi`` are used where the environment has them, never required.
"""

from __future__ import annotations

import gc
import sys
from typing import Any


def _loaded_torch(import_torch: bool) -> Any:
    """Return the torch module if it is loaded (or may be imported), else None. Never imports it otherwise."""
    if "torch" in sys.modules:
        return sys.modules["torch"]
    if not import_torch:
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch


def _reserved_bytes(torch: Any) -> int:
    return sum(torch.cuda.memory_reserved(i) for i in range(torch.cuda.device_count()))


def clear_cuda_cache(import_torch: bool = False) -> dict[str, Any]:
    """Free cached GPU memory: ``gc.collect()`` until nothing is left, then ``empty_cache`` and ``ipc_collect``.

    As ZenML's ``cleanup_memory``, but reports what it did. torch is used only if it is already loaded in this
    process (or ``import_torch`` is true): a process that never loaded torch holds no CUDA cache.

    :return: ``{"status": "cleared"|"skipped", "reason": str, "freed_bytes": int, "gc_rounds": int}``
    """
    torch = _loaded_torch(import_torch)
    if torch is None:  # nothing holds GPU memory: no collection (a worker's task process has a large heap to walk)
        return {"status": "skipped", "reason": "torch is not loaded", "freed_bytes": 0, "gc_rounds": 0}
    rounds = 0
    while rounds < 10:
        rounds += 1
        if gc.collect() == 0:
            break
    if not torch.cuda.is_available():
        return {"status": "skipped", "reason": "CUDA is not available", "freed_bytes": 0, "gc_rounds": rounds}
    if not torch.cuda.is_initialized():
        return {
            "status": "skipped",
            "reason": "CUDA was never initialised in this process",
            "freed_bytes": 0,
            "gc_rounds": rounds,
        }
    before = _reserved_bytes(torch)
    torch.cuda.empty_cache()
    torch.cuda.ipc_collect()
    freed = max(0, before - _reserved_bytes(torch))
    return {"status": "cleared", "reason": "", "freed_bytes": freed, "gc_rounds": rounds}


def cuda_memory_stats() -> list[dict[str, Any]]:
    """Per-device memory of this process (torch, if loaded and CUDA initialised), else of the device (NVML)."""
    torch = _loaded_torch(False)
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return [
            {
                "index": str(i),
                "name": torch.cuda.get_device_name(i),
                "allocated": torch.cuda.memory_allocated(i),
                "reserved": torch.cuda.memory_reserved(i),
                "total": torch.cuda.get_device_properties(i).total_memory,
            }
            for i in range(torch.cuda.device_count())
        ]
    return [
        {"index": g["index"], "name": g["name"], "used": g.get("memory_used"), "total": g["memory_total"]}
        for g in list_gpus()
    ]


def _nvml_gpus() -> list[dict[str, Any]] | None:
    try:
        import pynvml  # from nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                {
                    "index": str(i),
                    "uuid": pynvml.nvmlDeviceGetUUID(handle),
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "memory_total": int(memory.total),
                    "memory_used": int(memory.used),
                }
            )
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _nvidia_smi_gpus() -> list[dict[str, Any]] | None:
    import shutil  # here, not at the top: every task start (and every container start) pays for top-level imports
    import subprocess

    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    query = "--query-gpu=index,uuid,name,memory.total,memory.used"
    try:
        out = subprocess.run(
            [binary, query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = []
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 5:
            index, uuid, name, total, used = fields
            gpus.append(
                {
                    "index": index,
                    "uuid": uuid,
                    "name": name,
                    "memory_total": int(float(total)) * 2**20,
                    "memory_used": int(float(used)) * 2**20,
                }
            )
    return gpus


def list_gpus() -> list[dict[str, Any]]:
    """NVIDIA GPUs visible to this process: NVML (nvidia-ml-py) if importable, else ``nvidia-smi``, else none."""
    for probe in (_nvml_gpus, _nvidia_smi_gpus):
        gpus = probe()
        if gpus is not None:
            return gpus
    return []
