"""A Kubernetes task with an on_oom ladder, rendered by the render CLI in tests/operators/test_oom_escalation.py."""

from __future__ import annotations

import datetime

from airflow.sdk import DAG

from airflow_gpu_provider import GpuStepOperator, OomEscalation

with DAG("oom_render", schedule=None, start_date=datetime.datetime(2024, 1, 1)):
    GpuStepOperator(
        task_id="train",
        command=["python", "train.py"],
        backend="kubernetes",
        accelerator="L4",
        on_oom=OomEscalation(accelerators=["A100-80GB", "H100"]),
    )
