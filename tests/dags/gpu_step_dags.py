"""DAGs used by tests/operators and tests/decorators (dag.test() needs DAGs that live in a bundle)."""

from __future__ import annotations

import datetime
import sys

from airflow.sdk import DAG, Param

from airflow_gpu_provider import GpuStepOperator, ResourceSettings, gpu_task

START = datetime.datetime(2024, 1, 1)


def add(a, b, scale=1):
    return {"sum": (a + b) * scale}


def visible_devices():
    import os

    return {
        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "omp": os.environ.get("OMP_NUM_THREADS"),
        "custom": os.environ.get("CUSTOM_VAR"),
    }


def with_context(x, params=None, run_id=None, logical_date=None):
    return {"x": x, "params": params, "run_id": run_id, "has_date": logical_date is not None}


def explode():
    raise ValueError("boom from the GPU task")  # RAISE_LINE


def hang(pid_file):
    import os
    import subprocess
    import time

    child = subprocess.Popen(["sleep", "300"])
    with open(pid_file, "w") as handle:
        handle.write(f"{os.getpid()} {child.pid}")
    time.sleep(300)


def uses_tomli_w():
    import tomli_w

    return tomli_w.dumps({"ok": True}).strip()


with DAG("gpu_step_callable", schedule=None, start_date=START):
    GpuStepOperator(
        task_id="add",
        python_callable=add,
        op_args=[1, 2],
        op_kwargs={"scale": 3},
        resources=ResourceSettings(cpu_count=1),
    )

with DAG("gpu_step_devices", schedule=None, start_date=START):
    GpuStepOperator(
        task_id="two", python_callable=visible_devices, gpu_count=2, cpu_count=3, environment={"CUSTOM_VAR": "yes"}
    )
    GpuStepOperator(task_id="none", python_callable=visible_devices)

with DAG("gpu_step_missing", schedule=None, start_date=START):
    GpuStepOperator(task_id="greedy", python_callable=add, op_args=[1, 1], gpu_count=2)

with DAG(
    "gpu_step_templated", schedule=None, start_date=START, params={"n": Param(3, type="integer"), "policy": "fail"}
):
    GpuStepOperator(
        task_id="t", python_callable=visible_devices, gpu_count="{{ params.n }}", on_missing_gpu="{{ params.policy }}"
    )

with DAG("gpu_step_context", schedule=None, start_date=START, params={"lr": 0.1}):
    GpuStepOperator(task_id="ctx", python_callable=with_context, op_kwargs={"x": 5})

with DAG("gpu_step_exception", schedule=None, start_date=START):
    GpuStepOperator(task_id="explode", python_callable=explode)

with DAG("gpu_step_command", schedule=None, start_date=START):
    GpuStepOperator(task_id="ok", command=[sys.executable, "-c", "import sys; print(sys.argv[1:])", "a b", "$HOME"])
    GpuStepOperator(task_id="fails", command=f"{sys.executable} -c 'raise SystemExit(3)'")

with DAG("gpu_step_timeout", schedule=None, start_date=START, params={"pid_file": ""}):
    GpuStepOperator(
        task_id="hang",
        python_callable=hang,
        op_kwargs={"pid_file": "{{ params.pid_file }}"},
        gpu_count=1,
        execution_timeout=datetime.timedelta(seconds=4),
    )

with DAG("gpu_step_requirements", schedule=None, start_date=START):
    GpuStepOperator(task_id="req", python_callable=uses_tomli_w, requirements=["tomli-w==1.0.0"])


# ----------------------------------------------------------------------------- TaskFlow
with DAG("gpu_task_flow", schedule=None, start_date=START, params={"scale": 2}):

    @gpu_task(gpu_count=1, on_missing_gpu="cpu")
    def split(n: int, params=None) -> dict:
        return {"half": n / 2, "double": n * params["scale"]}

    @gpu_task(multiple_outputs=True, cpu_count=1)
    def stats(values: list) -> dict:
        return {"total": sum(values), "count": len(values)}

    from airflow.sdk import task

    @task.gpu(memory="1Gi")
    def combine(half: float, total: int, count: int) -> str:
        return f"{half}/{total}/{count}"

    parts = split(11)
    numbers = stats([1, 2, 3])
    combine(parts["half"], numbers["total"], numbers["count"])


# ----------------------------------------------------------------------------- listeners
with DAG("gpu_pool_check", schedule=None, start_date=START):
    GpuStepOperator(
        task_id="fits", python_callable=add, op_args=[1, 1], gpu_count=1, pool="test_gpu_pool", pool_slots=1
    )
    GpuStepOperator(
        task_id="too_big", python_callable=add, op_args=[1, 1], gpu_count=4, pool="test_gpu_pool", pool_slots=4
    )
    GpuStepOperator(task_id="from_config", python_callable=add, op_args=[1, 1], gpu_count=4)  # [gpu] pool

with DAG("gpu_pool_all", schedule=None, start_date=START):
    GpuStepOperator(
        task_id="whole_host", python_callable=add, op_args=[1, 1], gpu_count="all", executor_config={"mine": 1}
    )

    @task.gpu(gpu_count="all")
    def mapped_whole_host(x: int) -> int:
        return x

    mapped_whole_host.expand(x=[1, 2])

with DAG("cuda_listener", schedule=None, start_date=START):
    from airflow.sdk import task

    @task
    def in_process_torch() -> float:
        import torch

        return float(torch.ones(3).sum())

    in_process_torch()


def effective_resources():
    import json
    import os

    return json.loads(os.environ["AIRFLOW_GPU_RESOURCES"])


with DAG("gpu_step_resources", schedule=None, start_date=START):
    GpuStepOperator(
        task_id="given", python_callable=effective_resources, gpu_count=1, cpu_count=2, memory="1Gi", shm_size="256Mi"
    )
    GpuStepOperator(
        task_id="fallback", python_callable=effective_resources, gpu_count=2, accelerator="A100", on_missing_gpu="cpu"
    )


def scaled(a, b, scale=1):
    import os

    return {"sum": (a + b) * scale, "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}


with DAG("gpu_step_mapped", schedule=None, start_date=START):
    # the classic operator mapped: .partial() settles the task and places it (its GPU pool) as a plain task is
    GpuStepOperator.partial(
        task_id="classic",
        python_callable=scaled,
        op_args=[1, 2],
        gpu_count=1,
        on_missing_gpu="wait",
        backend_options={"devices": "0,1"},
    ).expand(op_kwargs=[{"scale": 1}, {"scale": 10}])

    @gpu_task(gpu_count=1, on_missing_gpu="wait", backend_options={"devices": "0,1"})
    def decorated(a: int, b: int) -> dict:
        return {"sum": a + b}

    decorated.partial(a=1).expand(b=[2, 3])
