"""DAGs of the deferrable-task tests (tests/backends/docker/test_docker_deferred.py, tests/host/test_wait_deferred.py)."""

from __future__ import annotations

import datetime
import os

from airflow.sdk import DAG

from airflow_gpu_provider import GpuStepOperator, ImageSettings, gpu_task

START = datetime.datetime(2024, 1, 1)
IMAGE = ImageSettings(parent_image=os.environ.get("AIRFLOW_GPU_TEST_BASE_IMAGE", "airflow-gpu-base:bookworm"))
DOCKER = {"backend": "docker", "image": IMAGE, "deferrable": True, "backend_options": {"stop_timeout": 2}}


def answers(question: str) -> dict:
    import time

    print("thinking about", question, flush=True)
    time.sleep(3)
    print("the answer is ready", flush=True)
    return {"question": question, "answer": 42}


def fails() -> None:
    print("about to fail", flush=True)
    raise ValueError("the deferred task's own error")


def fills_memory() -> None:
    held = []
    for _ in range(64):
        held.append(bytearray(16 * 2**20))  # 1 GiB in steps, against a 64 MiB limit


def sleeps() -> None:
    import time

    print("sleeping", flush=True)
    time.sleep(300)


def counts_its_runs() -> dict:
    """Append a line to the checkpoint folder for every process that runs this; return how many did."""
    import os
    import time

    folder = os.environ["AIRFLOW_GPU_CHECKPOINT_DIR"]
    with open(os.path.join(folder, "runs.txt"), "a") as handle:
        handle.write(f"{os.getpid()}\n")
    print("counted; working", flush=True)
    time.sleep(12)
    with open(os.path.join(folder, "runs.txt")) as handle:
        runs = len(handle.read().split())
    print("done after", runs, "run(s)", flush=True)
    return {"runs": runs}


with DAG("deferred_docker_success", schedule=None, start_date=START):
    GpuStepOperator(task_id="task", python_callable=answers, op_args=["{{ run_id }}"], **DOCKER)

with DAG("deferred_docker_failure", schedule=None, start_date=START):
    GpuStepOperator(task_id="task", python_callable=fails, **DOCKER)

with DAG("deferred_docker_oom", schedule=None, start_date=START):
    GpuStepOperator(task_id="task", python_callable=fills_memory, memory="64Mi", **DOCKER)

with DAG("deferred_docker_timeout", schedule=None, start_date=START):
    GpuStepOperator(task_id="task", python_callable=sleeps, execution_timeout=datetime.timedelta(seconds=6), **DOCKER)

for _name, _deferrable in (("reattach_docker", False), ("reattach_docker_deferred", True)):
    with DAG(_name, schedule=None, start_date=START, params={"root": "/tmp"}):
        GpuStepOperator(
            task_id="task",
            python_callable=counts_its_runs,
            checkpoint="{{ params.root }}",
            **{**DOCKER, "deferrable": _deferrable},
        )

# Waiting for the host's one GPU (tests list it: [gpu] devices = 0) in the triggerer, not in the worker
with DAG("deferred_wait", schedule=None, start_date=START):

    @gpu_task(gpu_count=1, on_missing_gpu="wait", deferrable=True, wait_timeout=30)
    def waits_for_the_gpu() -> str:
        import os

        return os.environ.get("CUDA_VISIBLE_DEVICES", "")

    waits_for_the_gpu()

with DAG("deferred_wait_timeout", schedule=None, start_date=START):

    @gpu_task(gpu_count=1, on_missing_gpu="wait", deferrable=True, wait_timeout=3)
    def gives_up() -> str:
        return "never"

    gives_up()
