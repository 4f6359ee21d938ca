"""DAGs for the GPU telemetry tests (tests/telemetry/test_telemetry_dags.py)."""

from __future__ import annotations

import datetime
import sys

from airflow.sdk import DAG

from airflow_gpu_provider import GpuStepOperator, OomEscalation

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

with DAG("telemetry_cpu_fallback", schedule=None, start_date=START, catchup=False):
    GpuStepOperator(task_id="fallback", python_callable=burn, op_args=[1.0], gpu_count=1, on_missing_gpu="cpu")


def short_of_memory_once() -> str:
    """Run out of host memory on the first rung (512 MiB), fit on the next (1 GiB)."""
    import json
    import os
    import time

    time.sleep(1)
    if json.loads(os.environ["AIRFLOW_GPU_RESOURCES"])["memory"] < 2**30:
        raise MemoryError("out of host memory on purpose")
    return "fits"


with DAG(
    "telemetry_tries",
    schedule=None,
    start_date=START,
    catchup=False,
    default_args={"retries": 1, "retry_delay": datetime.timedelta(0)},
):
    GpuStepOperator(
        task_id="grows", python_callable=short_of_memory_once, memory="512Mi", on_oom=OomEscalation(memory=["1Gi"])
    )


with DAG("forged_profile", schedule=None, start_date=START):
    from airflow.sdk import task

    @task
    def forger(ti=None) -> None:  # any task may push an XCom under gpu_profile; the GPUs page reads GPU tasks' only
        fake = {
            "version": 1,
            "kind": "gpu",
            "host": "forged-host",
            "duration_s": 3600,
            "samples": 1,
            "devices": [
                {"index": "0", "name": "NVIDIA H100 80GB HBM3", "memory_total": 85899345920, "mean_util": 99.0}
            ],
        }
        ti.xcom_push(key="gpu_profile", value=fake)

    forger() >> GpuStepOperator(task_id="real", python_callable=burn, op_args=[0.3])


with DAG("telemetry_docker", schedule=None, start_date=START, catchup=False):
    import os

    from airflow_gpu_provider import ImageSettings

    IMAGE = ImageSettings(parent_image=os.environ.get("AIRFLOW_GPU_TEST_BASE_IMAGE", "airflow-gpu-base:bookworm"))
    GpuStepOperator(task_id="plain", python_callable=burn, op_args=[1.0], backend="docker", image=IMAGE)
    GpuStepOperator(
        task_id="fallback",
        python_callable=burn,
        op_args=[1.0],
        backend="docker",
        image=IMAGE,
        gpu_count=1,
        on_missing_gpu="cpu",
    )
