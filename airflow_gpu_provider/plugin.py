"""Airflow plugin (``airflow.plugins`` entry point): registers the provider's listeners."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from airflow_gpu_provider.listeners import cuda_cache, gpu_pool


class GpuProviderPlugin(AirflowPlugin):
    """CUDA cache clearing between tasks on workers; GPU-pool checks in the scheduler."""

    name = "airflow_gpu_provider"
    listeners = [cuda_cache, gpu_pool]
