"""DAGs used by tests/backends/docker (dag.test() needs DAGs that live in a bundle)."""

from __future__ import annotations

import datetime
import os

from airflow.sdk import DAG

from airflow_gpu_provider import GpuStepOperator, ImageSettings, gpu_task

START = datetime.datetime(2024, 1, 1)
IMAGE = ImageSettings(parent_image=os.environ.get("AIRFLOW_GPU_TEST_BASE_IMAGE", "airflow-gpu-base:bookworm"))
SLEEP = ["python3", "-c", "import time; print('sleeping', flush=True); time.sleep(600)"]

with DAG("docker_xcom", schedule=None, start_date=START):

    @gpu_task(backend="docker", image=IMAGE, gpu_count=1, on_missing_gpu="cpu", memory="512Mi")
    def square(x: int, run_id: str | None = None) -> dict:
        import platform

        return {"square": x * x, "python": platform.python_version(), "run_id": run_id}

    square(12)

with DAG("docker_timeout", schedule=None, start_date=START):
    GpuStepOperator(
        task_id="sleepy",
        command=SLEEP,
        backend="docker",
        image=IMAGE,
        execution_timeout=datetime.timedelta(seconds=5),
        backend_options={"stop_timeout": 2},
    )


def use_memory(megabytes: int) -> dict:
    """Hold ``megabytes`` of memory: more than the first try's container may have."""
    import json
    import os

    blocks = [bytearray(1024 * 1024) for _ in range(megabytes)]
    return {"held_mb": len(blocks), "resources": json.loads(os.environ["AIRFLOW_GPU_RESOURCES"])}


with DAG(
    "docker_oom_escalation",
    schedule=None,
    start_date=START,
    default_args={"retries": 1, "retry_delay": datetime.timedelta(0)},
):
    from airflow_gpu_provider import OomEscalation

    GpuStepOperator(
        task_id="grow",
        python_callable=use_memory,
        op_args=[160],
        backend="docker",
        image=IMAGE,
        memory="64Mi",
        on_oom=OomEscalation(memory=["512Mi"]),
    )
