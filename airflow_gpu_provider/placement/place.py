"""The one seam of parse-time placement (pool, queue, executor, executor_config), for the operator and decorator."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from airflow_gpu_provider import config
from airflow_gpu_provider.backends import BACKENDS
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.placement import executors, pools
from airflow_gpu_provider.settings import ResourceSettings

if TYPE_CHECKING:
    from airflow_gpu_provider.backends.executor.options import ExecutorOptions

#: ``executor_config`` key that marks a placed ``pod_override`` (the decorator places before the operator does).
PLACED_KEY = "airflow_gpu_provider_placed"
#: Set by KubernetesExecutor in its worker pods, whose ``[core] executor`` is often LocalExecutor (the Helm chart's):
#: the task was placed where it was scheduled; the pod only runs it.
IN_EXECUTOR_POD = "AIRFLOW_IS_K8S_EXECUTOR_POD"


def place(  # noqa: PLR0917 - the operator and the decorator call it alike
    owner: str,
    backend: str | None,
    options: Any,
    resources: ResourceSettings,
    overrides: Mapping[str, Any],
    kwargs: dict[str, Any],
) -> dict[str, Any]:
    """``kwargs`` with the GPU pool and, on the executor backend, what the task's executor understands.

    :param backend: the task's ``backend`` (``None``: ``[gpu] backend``; a template: nothing to place)
    :param options: the task's ``backend_options`` (a mapping, or the parsed options)
    :param overrides: the templated resource fields (rendered when the task runs)
    """
    chosen = config.get("backend") if backend is None else backend
    if chosen == "executor":
        kwargs = for_executor(resources, overrides, kwargs, options, owner)
    pool = None
    if "pool" not in kwargs and (resources.requests_gpus or "gpu_count" in overrides):
        if "accelerator" in overrides and "{" in (config.get("pool") or ""):
            raise InvalidSettingError(
                owner,
                "accelerator",
                overrides["accelerator"],
                f"[gpu] pool {config.get('pool')!r} has a pool per worker class, chosen when the DAG is parsed, and a "
                "template is rendered only when the task runs",
                "a concrete accelerator, or a [gpu] pool without {accelerator} and {queue}",
            )
        pool = pools.pool_for(owner, resources, kwargs.get("queue"))
    return pools.with_gpu_pool(resources, overrides, kwargs, pool=pool)


def for_executor(
    resources: ResourceSettings, overrides: Mapping[str, Any], kwargs: dict[str, Any], options: Any, owner: str
) -> dict[str, Any]:
    """The executor's placement of a GPU task; CPU-only tasks keep their queue and executor.

    Inside a KubernetesExecutor worker pod (which parses the DAG again to run the task) nothing is placed.
    """
    parsed = cast("ExecutorOptions", BACKENDS["executor"].parse_options(options))  # loaded for executor tasks only
    if overrides:
        name, value = next(iter(overrides.items()))
        raise InvalidSettingError(
            owner,
            name,
            value,
            "the executor backend places the task when the DAG is parsed (its queue, executor and pod), and a "
            "template is rendered only when the task runs",
            f"a concrete {name} (the most the task may need), or a backend that places at run time "
            "(local, docker, kubernetes)",
        )
    if not resources.requests_gpus or os.environ.get(IN_EXECUTOR_POD):
        return kwargs
    requested = kwargs.get("executor") or parsed.executor or config.get("executor") or None
    executor = executors.chosen(owner, requested, executors.core_executors())
    placed = dict(kwargs)
    if requested and "executor" not in kwargs:
        placed["executor"] = executor.name
    if executor.kind in ("celery", "edge") and "queue" not in kwargs:
        placed["queue"] = executors.queue_for(owner, resources, parsed.queue or config.get("queue"))
    given = kwargs.get("executor_config") or {}
    if executor.kind == "kubernetes" and not given.get(PLACED_KEY):
        from airflow_gpu_provider.placement.pod_override import executor_config

        placed["executor_config"] = {
            **executor_config(owner, resources, parsed.kubernetes or {}, given),
            PLACED_KEY: True,
        }
    return placed
