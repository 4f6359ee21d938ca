"""Pure, immutable settings: what a task needs (resources) and what it runs with (image).

``OomEscalation`` loads on first use: most DAGs have no ladder, and every parse process pays for each import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow_gpu_provider.settings.accelerators import (
    AMD,
    AWS_NEURON,
    GOOGLE_TPU,
    INTEL,
    NVIDIA,
    Accelerator,
    GpuVendor,
    MigProfile,
)
from airflow_gpu_provider.settings.image import ImageSettings
from airflow_gpu_provider.settings.resources import ALL_GPUS, ResourceSettings

if TYPE_CHECKING:
    from airflow_gpu_provider.settings.escalation import OomEscalation

__all__ = [
    "ALL_GPUS",
    "AMD",
    "AWS_NEURON",
    "GOOGLE_TPU",
    "INTEL",
    "NVIDIA",
    "Accelerator",
    "GpuVendor",
    "ImageSettings",
    "MigProfile",
    "OomEscalation",
    "ResourceSettings",
]


def __getattr__(name: str) -> Any:
    if name == "OomEscalation":
        from airflow_gpu_provider.settings.escalation import OomEscalation

        return OomEscalation
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
