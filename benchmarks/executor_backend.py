"""Executor backend: a task's wall time vs the Docker backend on the same worker, and the parse cost of placement.

1. Wall time: the same function run by ``GpuStepOperator.execute()`` on the executor backend (the task process on
   the worker, as Celery/Edge/KubernetesExecutor workers run it) and on the Docker backend (a nested container from
   the base image), interleaved, fresh operators each run. Docker here has no NVIDIA runtime, so both run without a
   GPU request (a GPU request would not start a container at all); the executor backend is also timed with one
   GPU from a listed inventory (``[gpu] devices``), which adds the allocator's lock.
2. Parse: a 20-task ``@gpu_task`` DAG parsed as the DAG processor does (forked child, DagBag + serialisation), on the
   local backend, and on the executor backend under CeleryExecutor and KubernetesExecutor (which builds a ``V1Pod``
   per task and imports the kubernetes client), vs the same DAG with plain ``@task``.

    python benchmarks/executor_backend.py [--runs 10] [--parses 10] [--base-image airflow-gpu-base:bookworm]
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from _common import airflow_home, dag_processor_parent, in_child, parse_once

TASKS = 20


def work():
    total = 0
    for i in range(200_000):
        total += i * i % 7
    return total


def context(task_id: str) -> dict:
    ti = SimpleNamespace(dag_id="bench", task_id=task_id, run_id="bench", try_number=1, map_index=-1)
    return {"ti": ti}


def bench_wall_time(runs: int, base_image: str) -> dict[str, list[float]]:
    from airflow_gpu_provider import GpuStepOperator

    def executor(gpus: int) -> GpuStepOperator:
        options = {"devices": "0"} if gpus else {}
        return GpuStepOperator(
            task_id="t", python_callable=work, backend="executor", gpu_count=gpus, backend_options=options
        )

    contenders = {
        "executor backend, no GPU": lambda: executor(0),
        "docker backend, no GPU": lambda: GpuStepOperator(
            task_id="t", python_callable=work, backend="docker", parent_image=base_image
        ),
        "executor backend, 1 GPU (listed)": lambda: executor(1),
    }
    for make in contenders.values():  # warm-up: page cache, the Docker image
        make().execute(context("t"))
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(runs):
        for name, make in contenders.items():
            operator = make()
            started = time.perf_counter()
            operator.execute(context("t"))
            times[name].append(time.perf_counter() - started)
    return times


def write_dags(folder: Path) -> dict[str, Path]:
    """The same 20-task DAG with plain ``@task``, and with ``@gpu_task`` on the local and the executor backend."""
    files = {}
    for name, decorator in (
        ("plain", "task"),
        ("local", "gpu_task(gpu_count=1, memory='8Gi', backend='local')"),
        ("executor", "gpu_task(gpu_count=1, memory='8Gi', accelerator='H100', shm_size='2Gi', backend='executor')"),
    ):
        tasks = "\n".join(
            f"    @{decorator}\n    def work_{i}():\n        return {i}\n\n    work_{i}()\n" for i in range(TASKS)
        )
        files[name] = folder / f"bench_{name}.py"
        files[name].write_text(
            "import datetime\nfrom airflow.sdk import DAG, task\nfrom airflow_gpu_provider import gpu_task\n\n"
            f"with DAG('bench_{name}', schedule=None, start_date=datetime.datetime(2024, 1, 1)):\n{tasks}"
        )
    return files


def bench_parse(parses: int) -> dict[str, list[float]]:
    """Each file's parse child's CPU seconds, forked from a parent that did what ``airflow dag-processor`` does."""
    files = write_dags(Path(tempfile.mkdtemp(prefix="bench-executor-dags-")))
    dag_processor_parent(files.values())
    contenders = {
        "@task (plain)": (files["plain"], {}),
        "@gpu_task local backend": (files["local"], {}),
        "@gpu_task executor, CeleryExecutor": (files["executor"], {"AIRFLOW__CORE__EXECUTOR": "CeleryExecutor"}),
        "@gpu_task executor, KubernetesExecutor": (
            files["executor"],
            {"AIRFLOW__CORE__EXECUTOR": "KubernetesExecutor"},
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(parses):
        for name, (path, environment) in contenders.items():
            times[name].append(parse_once(path, environment))
    return times


def import_once(module: str) -> float:
    """Seconds to import ``module`` in a child forked from this process."""

    def load() -> float:
        started = time.perf_counter()
        importlib.import_module(module)
        return time.perf_counter() - started

    seconds = in_child(load)
    assert seconds is not None, module
    return seconds


def table(title: str, times: dict[str, list[float]], baseline: str) -> None:
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"\n## {title}\n")
    print(f"| {'contender':<40} | median | min | max | / {baseline} |")
    print(f"| {'-' * 40} | ---: | ---: | ---: | ---: |")
    for name, values in times.items():
        print(
            f"| {name:<40} | {medians[name] * 1000:.1f} ms | {min(values) * 1000:.1f} ms | "
            f"{max(values) * 1000:.1f} ms | {medians[name] / medians[baseline]:.3f}x |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--parses", type=int, default=10)
    parser.add_argument(
        "--base-image", default=os.environ.get("AIRFLOW_GPU_TEST_BASE_IMAGE", "airflow-gpu-base:bookworm")
    )
    parser.add_argument("--skip-docker", action="store_true", help="only the parse part (no Docker engine)")
    args = parser.parse_args()
    os.environ["AIRFLOW__GPU__DEVICES"] = "none"
    os.environ["AIRFLOW__GPU__PROFILE_INTERVAL"] = "0"  # same work on both sides: no sampler thread
    airflow_home()
    if not args.skip_docker:
        times = bench_wall_time(args.runs, args.base_image)
        table(f"GPU task wall time on one worker ({args.runs} runs, interleaved)", times, "docker backend, no GPU")
    table(f"DAG parse, {TASKS} tasks ({args.parses} parses each)", bench_parse(args.parses), "@task (plain)")
    imports = [import_once("kubernetes.client") for _ in range(args.parses)]
    print(f"\nkubernetes client import (once per parse): median {statistics.median(imports) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
