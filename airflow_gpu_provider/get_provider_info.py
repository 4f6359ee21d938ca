"""Provider metadata for Airflow's provider discovery (``apache_airflow_provider`` entry point)."""

from __future__ import annotations

from typing import Any

from airflow_gpu_provider.backends import describe_backends
from airflow_gpu_provider.config import provider_config
from airflow_gpu_provider.version import __version__


def get_provider_info() -> dict[str, Any]:
    """The provider dict, valid against Airflow's ``provider_info.schema.json``."""
    return {
        "package-name": "airflow-gpu-provider",
        "name": "GPU",
        "description": f"Run Airflow tasks on GPUs from one resource declaration, on {describe_backends()}, "
        "with 🤗 Accelerate launches, OOM escalation, deferral, durable reattach and GPU telemetry.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "GPU",
                "external-doc-url": "https://github.com/airflow-gpu-provider/airflow-gpu-provider",
                "tags": ["software"],
            }
        ],
        "operators": [
            {
                "integration-name": "GPU",
                "python-modules": [
                    "airflow_gpu_provider.operators.gpu_step",
                    "airflow_gpu_provider.operators.accelerate",
                ],
            },
        ],
        "hooks": [{"integration-name": "GPU", "python-modules": ["airflow_gpu_provider.hooks.cuda"]}],
        "triggers": [
            {
                "integration-name": "GPU",
                "python-modules": [
                    "airflow_gpu_provider.host.trigger",
                    "airflow_gpu_provider.backends.docker.trigger",
                    "airflow_gpu_provider.backends.ray.trigger",
                ],
            }
        ],
        "task-decorators": [{"name": "gpu", "class-name": "airflow_gpu_provider.decorators.gpu.gpu_task"}],
        "config": provider_config(),
    }
