"""Where the tests find this host's NVIDIA GPUs (for tests marked ``gpu``), independently of the provider.

A module of its own, not conftest: test modules import it by a name no other folder's conftest can shadow.
"""

from __future__ import annotations

import functools
import os

REQUIRE_GPU = os.environ.get("AIRFLOW_GPU_REQUIRE_GPU") == "1"


@functools.cache
def nvidia_gpus() -> tuple[tuple[str, ...], str]:
    """The UUIDs of this host's NVIDIA GPUs as NVML reports them, and why there are none when there are none.

    Asked of NVML directly (nvidia-ml-py), not through the provider, so that tests can hold the provider to it.
    """
    try:
        import pynvml
    except ImportError:
        return (), "nvidia-ml-py is not installed (the provider's nvml extra: pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return (), f"NVML cannot start ({err}): no usable NVIDIA driver here"
    try:
        uuids = tuple(
            pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())
        )
    finally:
        pynvml.nvmlShutdown()
    return tuple(u.decode() if isinstance(u, bytes) else u for u in uuids), "" if uuids else "NVML found no GPU"


def gpu_environment(**extra: str) -> dict[str, str]:
    """The test environment with the GPU pins lifted: NVML inventory, every GPU visible to torch."""
    environment = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    return {**environment, "AIRFLOW__GPU__DEVICES": "auto", **extra}
