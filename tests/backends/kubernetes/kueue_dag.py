"""The Kueue worked example of docs/kubernetes-admin.md: one pod and one two-node Indexed Job in LocalQueue ``team-a``."""

from __future__ import annotations

import datetime

from airflow.sdk import DAG

from airflow_gpu_provider import AccelerateOperator, GpuStepOperator, ResourceSettings

KUEUE = {"namespace": "ml", "kueue_queue": "team-a", "kueue_priority_class": "gpu-high"}

with DAG("kueue_example", schedule=None, start_date=datetime.datetime(2024, 1, 1)):
    GpuStepOperator(
        task_id="fine_tune",
        command=["python", "fine_tune.py"],
        backend="kubernetes",
        resources=ResourceSettings(accelerator="H100:1", cpu_count=8, memory="64Gi"),
        backend_options=KUEUE,
    )
    AccelerateOperator(
        task_id="pretrain",
        script="pretrain.py",
        num_machines=2,
        backend="kubernetes",
        resources=ResourceSettings(accelerator="H100:8", cpu_count=32, memory="512Gi", shm_size="64Gi"),
        backend_options=KUEUE,
    )
