"""A task on the fourth backend of tests/backends/fourth_backend.py, while tests/backends/test_registry.py has it
registered (otherwise this file defines no DAG)."""

from __future__ import annotations

import datetime

from airflow.sdk import DAG

from airflow_gpu_provider import GpuStepOperator
from airflow_gpu_provider.backends import BACKENDS


def add(a, b):
    return {"sum": a + b}


if "inline" in BACKENDS:
    with DAG("fourth_backend", schedule=None, start_date=datetime.datetime(2024, 1, 1)):
        GpuStepOperator(task_id="add", python_callable=add, op_args=[2, 3], backend="inline")
