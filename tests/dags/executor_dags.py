"""The same DAG on every executor: a GPU task on the executor backend and a plain task, each saying where it ran.

The GPU task's queue, executor or pod come from the deployment's configuration when this file is parsed
(``[core] executor``, ``[gpu] queue``, ``[gpu] executor``); the file itself never changes.
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG, task

from airflow_gpu_provider import GpuStepOperator


def where():
    import os

    return {
        "worker": os.environ.get("AIRFLOW_GPU_TEST_WORKER", "?"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


with DAG("executor_gpu", schedule=None, start_date=datetime.datetime(2024, 1, 1), catchup=False):
    train = GpuStepOperator(task_id="train", python_callable=where, backend="executor", gpu_count=1, shm_size="1Gi")

    @task
    def prepare():
        return where()

    prepare() >> train


# GPU pools per worker class ([gpu] pool = gpu-{accelerator}): tests/executors/test_placement.py
with DAG("executor_pools", schedule=None, start_date=datetime.datetime(2024, 1, 1), catchup=False):
    GpuStepOperator(task_id="a100", command=["true"], backend="executor", gpu_count=2, accelerator="A100")
    GpuStepOperator(task_id="h100", command=["true"], backend="executor", gpu_count=1, accelerator="H100")
