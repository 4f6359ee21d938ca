"""The executor backend's parse-time half: where Airflow's executor sends a GPU task (queue, executor, pod).

The registry names :func:`place` as this backend's placement (``BackendInfo.placement``): the task's settling
(``operators/spec.py``) calls it when the DAG is parsed, because an executor reads ``queue``, ``executor`` and
``executor_config`` from the serialized DAG, before any code of the task runs. On the worker, pod or queue it was
given, the task then runs as the local backend runs it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from airflow_gpu_provider.backends.executor import executors
from airflow_gpu_provider.backends.executor.options import ExecutorOptions
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.settings import ResourceSettings

#: ``executor_config`` key that marks a placed ``pod_override`` (a decorated task is placed before its operator).
PLACED_KEY = "airflow_gpu_provider_placed"
#: Set by KubernetesExecutor in its worker pods, whose ``[core] executor`` is often LocalExecutor (the Helm chart's):
#: the task was placed where it was scheduled; the pod only runs it.
IN_EXECUTOR_POD = "AIRFLOW_IS_K8S_EXECUTOR_POD"


def place(
    owner: str,
    resources: ResourceSettings,
    templated: Mapping[str, Any],
    options: ExecutorOptions,
    kwargs: dict[str, Any],
    *,
    default_executor: str,
    default_queue: str,
) -> dict[str, Any]:
    """``kwargs`` with the executor's placement of a GPU task; CPU-only tasks keep their queue and executor.

    Inside a KubernetesExecutor worker pod (which parses the DAG again to run the task) nothing is placed.

    :param templated: the templated resource fields: the executor places when the DAG is parsed, so none may be
    :param default_executor: ``[gpu] executor``
    :param default_queue: ``[gpu] queue``
    """
    if templated:
        name, value = next(iter(templated.items()))
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
    requested = kwargs.get("executor") or options.executor or default_executor or None
    executor = executors.chosen(owner, requested, executors.core_executors())
    placed = dict(kwargs)
    if requested and "executor" not in kwargs:
        placed["executor"] = executor.name
    if executor.kind in ("celery", "edge") and "queue" not in kwargs:
        placed["queue"] = executors.queue_for(owner, resources, options.queue or default_queue)
    given = kwargs.get("executor_config") or {}
    if executor.kind == "kubernetes":
        from airflow_gpu_provider.backends.executor import pod_override  # the kubernetes client

        if given.get(PLACED_KEY):  # placed by the decorator: judged again, as anyone can write the mark
            placed["executor_config"] = pod_override.check_placed(owner, options.kubernetes or {}, given)
        else:
            placed["executor_config"] = {
                **pod_override.executor_config(owner, resources, options.kubernetes or {}, given),
                PLACED_KEY: True,
            }
    return placed
