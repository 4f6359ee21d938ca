"""One ResourceSettings, two ways to get its GPUs on Kubernetes: the device plugin and DRA (the golden test in
tests/backends/kubernetes/test_k8s_dra.py and the worked examples of docs/kubernetes-admin.md render these tasks)."""

from __future__ import annotations

import datetime

from airflow.sdk import DAG

from airflow_gpu_provider import GpuStepOperator, OomEscalation, ResourceSettings

TRAIN = ResourceSettings(accelerator=["H100", "A100-80GB"], gpu_count=2, cpu_count=8, memory="64Gi", shm_size="8Gi")

with DAG("dra_render", schedule=None, start_date=datetime.datetime(2024, 1, 1)):
    for allocation in ("device-plugin", "dra"):
        GpuStepOperator(
            task_id=f"train_{allocation.replace('-', '_')}",
            command=["python", "train.py"],
            backend="kubernetes",
            resources=TRAIN,
            on_oom=OomEscalation(accelerators=["H200"]),
            backend_options={"namespace": "ml", "gpu_allocation": allocation},
        )
