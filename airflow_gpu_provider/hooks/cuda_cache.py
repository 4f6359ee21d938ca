"""Clear the CUDA cache of a worker's task process after every task (``[gpu] clear_cache_between_tasks``)."""

from __future__ import annotations

from typing import Any

from airflow.listeners import hookimpl

from airflow_gpu_provider import config


def _clear() -> None:
    if config.get("clear_cache_between_tasks"):
        from airflow_gpu_provider.hooks.cuda import CudaHook

        CudaHook().clear_cache()


@hookimpl
def on_task_instance_success(previous_state: Any, task_instance: Any) -> None:
    """After a task succeeds."""
    _clear()


@hookimpl
def on_task_instance_failed(previous_state: Any, task_instance: Any, error: Any) -> None:
    """After a task fails."""
    _clear()
