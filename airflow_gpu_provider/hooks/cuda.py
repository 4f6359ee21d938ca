"""``CudaHook``: GPU inventory, memory statistics and CUDA cache clearing.

It never imports torch into a process that has not loaded it: a process that never loaded torch holds no CUDA
cache, and importing torch costs seconds. The work is done by the runtime's helpers, which the task process
(child, container or pod) runs before and after the user code.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.common.compat.sdk import BaseHook  # airflow.sdk from 3.1, airflow.hooks.base before

from airflow_gpu_provider.runtime.cuda import clear_cuda_cache, cuda_memory_stats, list_gpus
from airflow_gpu_provider.settings.units import format_bytes


class CudaHook(BaseHook):
    """Inspect GPUs and free cached CUDA memory in the current process.

    :param import_torch: import torch if it is not loaded yet (off by default: a process without torch has
        nothing to free)
    """

    hook_name = "CUDA"

    def __init__(self, import_torch: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.import_torch = import_torch

    def get_inventory(self) -> list[dict[str, Any]]:
        """NVIDIA GPUs visible to this process (NVML, else ``nvidia-smi``): index, uuid, name, memory."""
        return list_gpus()

    def memory_stats(self) -> list[dict[str, Any]]:
        """Per-device memory: allocated/reserved by this process when it uses CUDA, else used/total (NVML)."""
        return cuda_memory_stats()

    def clear_cache(self) -> dict[str, Any]:
        """``gc.collect()`` until stable, then ``torch.cuda.empty_cache()`` and ``ipc_collect()``.

        A no-op, with one log line, when torch is not loaded or CUDA is absent.

        :return: ``{"status": "cleared"|"skipped", "reason": ..., "freed_bytes": ..., "gc_rounds": ...}``
        """
        result = clear_cuda_cache(import_torch=self.import_torch)
        if result["status"] == "cleared":
            self.log.info("CUDA cache cleared: %s freed", format_bytes(result["freed_bytes"]))
        else:
            self.log.info("CUDA cache clear skipped: %s", result["reason"])
        return result
