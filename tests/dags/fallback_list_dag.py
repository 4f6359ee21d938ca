"""A local GPU task with a fallback list of models (tests/host/test_fallback_list.py runs it)."""

from __future__ import annotations

import datetime

from airflow.sdk import DAG

from airflow_gpu_provider import GpuStepOperator


def visible_devices():
    import os

    return {"cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}


with DAG("fallback_list", schedule=None, start_date=datetime.datetime(2024, 1, 1)):
    GpuStepOperator(
        task_id="train", python_callable=visible_devices, backend="local", accelerator=["H100", "A100-80GB"]
    )
