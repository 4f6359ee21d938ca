"""DAGs of tests/operators/test_front_door.py: every GPU argument through ``.partial()`` and ``.expand()``."""

from __future__ import annotations

import datetime

from airflow.sdk import DAG, Param

from airflow_gpu_provider import GpuStepOperator, gpu_task

START = datetime.datetime(2024, 1, 1)
ROOT = "{{ params.root }}"


def checkpoint_folder(index: int) -> dict:
    import os

    return {"index": index, "folder": os.environ.get("AIRFLOW_GPU_CHECKPOINT_DIR")}


with DAG("front_door_mapped", schedule=None, start_date=START, params={"root": Param("/tmp", type="string")}):
    # what raised TypeError in .partial() (the mixins' arguments, which Airflow could not see)
    GpuStepOperator.partial(
        task_id="partial",
        python_callable=checkpoint_folder,
        checkpoint=f"{ROOT}/partial",
        deferrable=False,
        durable=False,
        wait_timeout=60,
    ).expand(op_args=[[0], [1]])
    # ... and in .expand(): a checkpoint root per map index
    GpuStepOperator.partial(task_id="expanded", python_callable=checkpoint_folder).expand(
        checkpoint=[f"{ROOT}/a", f"{ROOT}/b"], op_args=[[0]]
    )
    gpu_task(checkpoint=f"{ROOT}/decorated", durable=False, resume=True)(checkpoint_folder).expand(index=[0, 1])
