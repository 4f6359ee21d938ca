"""DAGs for the GPU telemetry tests (tests/telemetry/test_telemetry_dags.py)."""

from __future__ import annotations

import datetime
import sys

from airflow.sdk import DAG

from airflow_gpu_provider import GpuStepOperator

START = datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)


def burn(seconds: float) -> str:
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "burnt"


def out_of_memory() -> None:
    import time

    time.sleep(1)
    raise MemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


with DAG("telemetry_local", schedule=None, start_date=START, catchup=False) as telemetry_local:
    GpuStepOperator(task_id="busy", python_callable=burn, op_args=[2.0], memory="2Gi", cpu_count=1)
    GpuStepOperator(task_id="fails", python_callable=out_of_memory)
    GpuStepOperator(task_id="exits", command=[sys.executable, "-c", "import time; time.sleep(1); raise SystemExit(3)"])

with DAG("telemetry_gpu", schedule=None, start_date=START, catchup=False) as telemetry_gpu:
    GpuStepOperator(task_id="one_gpu", python_callable=burn, op_args=[1.5], gpu_count=1)
