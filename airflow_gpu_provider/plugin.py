"""Airflow plugin (``airflow.plugins`` entry point): the provider's listeners and its GPU telemetry UI."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from airflow_gpu_provider.backends.ray import listener as ray_jobs
from airflow_gpu_provider.checkpoint import cleanup as checkpoint_cleanup
from airflow_gpu_provider.decorators import preload
from airflow_gpu_provider.hooks import cuda_cache
from airflow_gpu_provider.pools import listener as gpu_pool
from airflow_gpu_provider.telemetry import stored as stored_profiles
from airflow_gpu_provider.telemetry.ui import EXTERNAL_VIEWS, FASTAPI_APPS


class GpuProviderPlugin(AirflowPlugin):
    """The listeners (CUDA cache, GPU pool, checkpoint cleanup, Ray jobs, the parse path, profiles stored) and the UI.

    CUDA cache clearing between tasks on workers; GPU-pool checks and checkpoint cleanup in the scheduler; a Ray job
    stopped once its task instance ends without its worker (the API server, the scheduler); the parse path imported
    once in the DAG processor.

    The UI's app (``ui/app.py``) is built on its first request in the API server: importing this plugin stays cheap
    for every other component.
    """

    name = "airflow_gpu_provider"
    listeners = [cuda_cache, gpu_pool, checkpoint_cleanup, ray_jobs, preload, stored_profiles]
    fastapi_apps = FASTAPI_APPS
    external_views = EXTERNAL_VIEWS
