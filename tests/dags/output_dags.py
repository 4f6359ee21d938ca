"""DAGs for tests/task/test_task_output.py: how a failed try reads in its task log."""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

from airflow.sdk import DAG

from airflow_gpu_provider import AccelerateOperator, GpuStepOperator

START = datetime.datetime(2024, 1, 1)
SCRIPT = str(Path(__file__).resolve().parents[1] / "scripts" / "failing_script.py")


def fails_deep_inside():
    def load(path):
        raise FileNotFoundError(f"no data at {path}")  # FUNCTION_RAISE_LINE

    return load("/data/train.parquet")


def one_rank_raises():
    from accelerate import Accelerator

    accelerator = Accelerator()
    if accelerator.process_index == 1:
        raise RuntimeError("rank 1 cannot go on")  # RANK_RAISE_LINE
    accelerator.wait_for_everyone()


with DAG("output_function", schedule=None, start_date=START):
    GpuStepOperator(task_id="function", python_callable=fails_deep_inside)

with DAG("output_command", schedule=None, start_date=START):
    GpuStepOperator(task_id="command", command=[sys.executable, SCRIPT, "--raise"])

with DAG("output_accelerate", schedule=None, start_date=START, params={"pid_dir": ""}):
    AccelerateOperator(task_id="raising_rank", python_callable=one_rank_raises, cpu=True, num_processes=2)
    AccelerateOperator(
        task_id="killed_script_rank",
        script=SCRIPT,
        script_args=["--kill-rank", "1", "--pid-dir", "{{ params.pid_dir }}"],
        cpu=True,
        num_processes=2,
        execution_timeout=datetime.timedelta(minutes=3),
    )
    # cpu_count: a one-process --cpu launch without OMP_NUM_THREADS has accelerate pick (and announce) its threads
    AccelerateOperator(
        task_id="raising_script", script=SCRIPT, script_args=["--raise"], cpu=True, num_processes=1, cpu_count=1
    )


def square(x: int) -> dict:
    return {"x": x, "loss": x * x}


def best(results: list) -> dict:
    return min(results, key=lambda result: result["loss"])


def returns_a_set() -> dict:
    return {"metrics": {"loss": {1, 2}}}


with DAG("output_quiet", schedule=None, start_date=START):
    from airflow_gpu_provider import gpu_task

    gpu_task(best)(gpu_task(square).expand(x=[2, 1]))
    GpuStepOperator(task_id="unsendable", python_callable=returns_a_set)
