"""DAGs of tests/executors/test_start_from_trigger.py: a task that must wait for the host's one GPU starts in the
triggerer (Airflow 3.3's ``start_from_trigger``): no worker runs it until the GPU is free.

No trigger queues here (``[triggerer] queues_enabled`` off: the start trigger Airflow makes has no queue); the host
lists one GPU (``[gpu] devices = 0``), which the test holds.
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG

from airflow_gpu_provider import gpu_task

with DAG("sched_start_from_trigger", schedule=None, start_date=datetime.datetime(2024, 1, 1)):

    @gpu_task(backend="local", gpu_count=1, on_missing_gpu="wait", deferrable=True, wait_timeout=120)
    def waits() -> dict:
        import os
        import time

        return {"gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "started": time.time()}

    waits()
