"""Pure, immutable settings: what a task needs (resources) and what it runs with (image)."""

from __future__ import annotations

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
from airflow_gpu_provider.settings.escalation import OomEscalation
from airflow_gpu_provider.settings.image import ImageSettings
from airflow_gpu_provider.settings.resources import ALL_GPUS, ResourceSettings

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
