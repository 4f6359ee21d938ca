"""The provider's modules imported once, before Airflow forks the processes that need them (a listener).

Airflow's DAG processor parses each DAG file in a child forked from its manager, and imports in the manager, before
the fork, the ``airflow.*`` modules the file imports (``[dag_processor] parsing_pre_import_modules``), so that no
parse pays for them again. A DAG file that uses ``@task.gpu`` or ``GpuStepOperator`` reaches the provider through
``airflow.sdk`` or ``airflow_gpu_provider``, which that does not cover: every parse child would import the
provider's parse path anew. :func:`on_starting` imports it in the manager instead, when its job starts (before the
manager freezes its heap), under the same option.

Likewise the scheduler of a ``LocalExecutor``, whose worker processes it forks, and which fork each task process
(Linux: no ``exec``): a GPU task's process would import the local backend's run half when its try starts, between
the GPU's hand-over and the task's start (``benchmarks/gpu_queue.py``). The scheduler imports it first
(:data:`RUN_PATH`, the standard library and the provider alone), under ``[core] executor`` naming ``LocalExecutor``.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

from airflow.listeners import hookimpl

log = logging.getLogger(__name__)

#: What parsing a DAG file of GPU tasks imports, whatever the tasks ask for (each backend's parse half too).
PARSE_PATH = ("airflow_gpu_provider.decorators.gpu",)
#: What a try of a local-backend task imports when it starts (the executor backend's too: the same run half).
RUN_PATH = (
    "airflow_gpu_provider.operators.execution",
    "airflow_gpu_provider.backends.local.backend",
    "airflow_gpu_provider.telemetry.report",
    "airflow_gpu_provider.telemetry.right_size",
)


def is_dag_processor(component: Any) -> bool:
    """Whether ``component`` is the DAG processor's job (Airflow calls listeners before it sets ``job_type``)."""
    job_type = getattr(component, "job_type", "")
    return job_type == "DagProcessorJob" or (job_type is None and sys.argv[1:2] == ["dag-processor"])


def preload() -> None:
    """Import the parse path, and each backend's parse half (its options, its placement): a task may name any.

    Parse halves import no third-party client (``tests/test_parse_cost.py``): a few dozen small modules, once.
    """
    for module in PARSE_PATH:
        importlib.import_module(module)
    from airflow_gpu_provider.backends import BACKENDS

    for backend in BACKENDS.values():
        backend.options_class()
        if backend.placement is not None:  # the executor backend's queue, executor and pod_override at parse
            importlib.import_module(backend.placement.split(":")[0])


def forks_local_tasks(component: Any) -> bool:
    """Whether ``component`` is the job of a scheduler whose ``LocalExecutor`` forks the task processes."""
    job_type = getattr(component, "job_type", "")
    if not (job_type == "SchedulerJob" or (job_type is None and sys.argv[1:2] == ["scheduler"])):
        return False
    from airflow_gpu_provider.config import airflow_setting

    return "LocalExecutor" in (airflow_setting("core", "executor", "") or "")


@hookimpl
def on_starting(component: Any) -> None:
    """When the DAG processor or the scheduler of a ``LocalExecutor`` starts.

    The DAG processor's unless ``[dag_processor] parsing_pre_import_modules`` is off.
    """
    from airflow_gpu_provider.config import airflow_setting

    if forks_local_tasks(component):
        try:
            for module in (*PARSE_PATH, *RUN_PATH):
                importlib.import_module(module)
        except Exception:  # never stop the scheduler: each task process imports what it needs itself
            log.exception("Importing the GPU provider's run half in the scheduler failed")
        return
    if not is_dag_processor(component):
        return
    if (airflow_setting("dag_processor", "parsing_pre_import_modules", "True") or "").lower() not in ("true", "t", "1"):
        return
    try:
        preload()
    except Exception:  # a listener must never stop the DAG processor: each parse imports what it needs itself
        log.exception("Importing the GPU provider's parse path in the DAG processor failed")
