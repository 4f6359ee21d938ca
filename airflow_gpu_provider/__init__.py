"""airflow-gpu-provider: run Airflow tasks on GPUs from one resource declaration.

Public API::

    from airflow_gpu_provider import GpuStepOperator, ImageSettings, ResourceSettings, gpu_task, pytorch_image
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from airflow_gpu_provider.version import __version__

# name -> module; imported on first use so that ``import airflow_gpu_provider`` stays cheap.
_EXPORTS = {
    "ResourceSettings": "airflow_gpu_provider.settings",
    "ImageSettings": "airflow_gpu_provider.settings",
    "GpuVendor": "airflow_gpu_provider.settings",
    "Accelerator": "airflow_gpu_provider.settings",
    "MigProfile": "airflow_gpu_provider.settings",
    "OomEscalation": "airflow_gpu_provider.settings",
    "GpuStepOperator": "airflow_gpu_provider.operators.gpu_step",
    "GpuRetryPolicy": "airflow_gpu_provider.escalation.retry_policy",
    "AccelerateOperator": "airflow_gpu_provider.operators.accelerate",
    "gpu_task": "airflow_gpu_provider.decorators.gpu",
    "CudaHook": "airflow_gpu_provider.hooks.cuda",
    "pytorch_image": "airflow_gpu_provider.backends.docker.images.catalogue",
}
__all__ = [
    "AccelerateOperator",
    "Accelerator",
    "CudaHook",
    "GpuRetryPolicy",
    "GpuStepOperator",
    "GpuVendor",
    "ImageSettings",
    "MigProfile",
    "OomEscalation",
    "ResourceSettings",
    "__version__",
    "gpu_task",
    "pytorch_image",
]

if TYPE_CHECKING:
    from airflow_gpu_provider.backends.docker.images.catalogue import pytorch_image
    from airflow_gpu_provider.decorators.gpu import gpu_task
    from airflow_gpu_provider.escalation.retry_policy import GpuRetryPolicy
    from airflow_gpu_provider.hooks.cuda import CudaHook
    from airflow_gpu_provider.operators.accelerate import AccelerateOperator
    from airflow_gpu_provider.operators.gpu_step import GpuStepOperator
    from airflow_gpu_provider.settings import (
        Accelerator,
        GpuVendor,
        ImageSettings,
        MigProfile,
        OomEscalation,
        ResourceSettings,
    )


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'airflow_gpu_provider' has no attribute {name!r}")
