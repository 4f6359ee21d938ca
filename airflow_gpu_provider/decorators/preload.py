"""The DAG processor imports the provider's parse path once, before it forks its parse children (a listener).

Airflow's DAG processor parses each DAG file in a child forked from its manager, and imports in the manager, before
the fork, the ``airflow.*`` modules the file imports (``[dag_processor] parsing_pre_import_modules``), so that no
parse pays for them again. A DAG file that uses ``@task.gpu`` or ``GpuStepOperator`` reaches the provider through
``airflow.sdk`` or ``airflow_gpu_provider``, which that does not cover: every parse child would import the
provider's parse path anew. :func:`on_starting` imports it in the manager instead, when its job starts (before the
manager freezes its heap), under the same option.
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


@hookimpl
def on_starting(component: Any) -> None:
    """When the DAG processor starts, unless ``[dag_processor] parsing_pre_import_modules`` is off."""
    if not is_dag_processor(component):
        return
    from airflow_gpu_provider.config import airflow_setting

    if (airflow_setting("dag_processor", "parsing_pre_import_modules", "True") or "").lower() not in ("true", "t", "1"):
        return
    try:
        preload()
    except Exception:  # a listener must never stop the DAG processor: each parse imports what it needs itself
        log.exception("Importing the GPU provider's parse path in the DAG processor failed")
