"""DAGs of the Ray backend's tests (tests/backends/ray/): each task is a Ray job on the tests' own cluster.

The cluster is the ``ray_default`` connection's (set by the cluster fixture, with the cluster's token); the
wheels folder of the injected requirement from ``AIRFLOW_GPU_TEST_WHEELS``. Its two nodes are labelled
``gpu-model=A100`` (the head) and ``gpu-model=H100``: ``accelerator=`` selects on that label here.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

from airflow.sdk import DAG

from airflow_gpu_provider import AccelerateOperator, GpuStepOperator, ImageSettings, OomEscalation

START = datetime.datetime(2024, 1, 1)
RAY = {"backend": "ray", "backend_options": {"accelerator_label": "gpu-model"}}
ON_HEAD = {**RAY, "backend_options": {"label_selector": {"gpu-model": "A100"}}}


def where(run: str = "") -> dict:
    """What the job sees: its GPUs, its node (the address of the raylet it runs beneath), when it ran.

    ``run`` (the run's id) makes two runs' jobs differ: the tests' two nodes share one folder for the jobs'
    working_dirs, which Ray names by their content (tests/backends/ray/ray_cluster.py).

    With ``BARRIER`` (a folder), it first waits until another job has started too: two jobs that Ray can run at once
    then run at once, however late their workers start.
    """
    import json
    import os
    import time

    started, pid, node = time.time(), os.getpid(), "?"
    while pid > 1 and node == "?":  # the job's driver runs beneath its node's raylet
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().decode(errors="replace").split("\0")
        if argv[0].endswith("raylet"):
            node = next((a.split("=", 1)[1] for a in argv if a.startswith("--node_ip_address=")), "?")
        with open(f"/proc/{pid}/stat") as handle:
            pid = int(handle.read().rsplit(")", 1)[1].split()[1])
    barrier = os.environ.get("BARRIER")
    if barrier:  # a run of two: each waits (3 min at most) for the other to have started too
        os.makedirs(barrier, exist_ok=True)
        open(os.path.join(barrier, str(os.getpid())), "w").close()
        deadline = time.time() + 180
        while len(os.listdir(barrier)) < 2 and time.time() < deadline:
            time.sleep(0.2)
        started = time.time()
    time.sleep(float(os.environ.get("SLEEP", "0")))
    found = {"gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "node": node, "start": started, "end": time.time()}
    return {**found, "resources": json.loads(os.environ["AIRFLOW_GPU_RESOURCES"])}


def uses_project_code() -> dict:
    import os

    import plmod
    import plpkg.layers

    return {"plmod": plmod.double(21), "layers": plpkg.layers.NAME, "gpus": os.environ["CUDA_VISIBLE_DEVICES"]}


def uses_the_requirement() -> bool:
    import airflow_gpu_private  # installed by the cluster from the job's runtime_env

    return airflow_gpu_private.SECRET_PACKAGE


def sleeps(*_arguments: str) -> None:
    import time

    print("sleeping", flush=True)
    time.sleep(300)


def needs_a_module_the_cluster_lacks() -> None:
    import airflow_gpu_no_such_module  # noqa: F401 - the job's Python has no such module: the job says so at once


def grows(megabytes: int) -> dict:
    """Hold ``megabytes`` within the memory the job reserved (Ray reserves, it does not limit: the task does)."""
    import json
    import os
    import resource

    memory = json.loads(os.environ["AIRFLOW_GPU_RESOURCES"])["memory"]
    resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))
    blocks = [bytearray(2**20) for _ in range(megabytes)]
    return {"held_mb": len(blocks), "memory": memory}


with DAG("ray_basics", schedule=None, start_date=START):  # what one worker checks in one run, task by task
    GpuStepOperator(
        task_id="one_gpu", python_callable=uses_project_code, gpu_count=1, modules=["plmod", "plpkg"], **RAY
    )
    GpuStepOperator(
        task_id="requirement",
        python_callable=uses_the_requirement,
        image=ImageSettings(
            requirements=["airflow-gpu-private==1.0"],
            find_links=[os.environ.get("AIRFLOW_GPU_TEST_WHEELS", "/nowhere")],
        ),
        **RAY,
    )
    GpuStepOperator(task_id="second_model", python_callable=where, accelerator=["B200", "H100"], **RAY)
    GpuStepOperator(task_id="no_such_model", python_callable=where, accelerator="B200", on_missing_gpu="cpu", **RAY)
    GpuStepOperator(task_id="deferred", python_callable=where, gpu_count=1, deferrable=True, **RAY)
    GpuStepOperator(
        task_id="timeout", python_callable=sleeps, execution_timeout=datetime.timedelta(seconds=10), gpu_count=1, **RAY
    )
    GpuStepOperator(task_id="missing_module", python_callable=needs_a_module_the_cluster_lacks, **RAY)
    GpuStepOperator(  # a connection without the token (the test's environment defines it): refused, nothing sent
        task_id="no_token", python_callable=where, backend="ray", backend_options={"ray_conn_id": "ray_no_token"}
    )
    GpuStepOperator(
        task_id="grow",
        python_callable=grows,
        op_args=[160],
        memory="64Mi",
        on_oom=OomEscalation(memory=["512Mi"]),
        retries=1,
        retry_delay=datetime.timedelta(0),
        **RAY,
    )

with DAG("ray_at_once", schedule=None, start_date=START):  # run by two workers at once: their tasks meet
    _barrier = os.environ.get("AIRFLOW_GPU_TEST_BARRIER", "")
    _two = GpuStepOperator(
        task_id="two_gpus",
        python_callable=where,
        op_args=["{{ run_id }}"],
        gpu_count=2,
        image=ImageSettings(environment={"SLEEP": "3", "BARRIER": _barrier and f"{_barrier}/two_gpus"}),
        **RAY,
    )
    _half = GpuStepOperator(
        task_id="half_gpu",
        python_callable=where,
        op_args=["{{ run_id }}"],
        gpu_count=0.5,
        image=ImageSettings(environment={"SLEEP": "3", "BARRIER": _barrier and f"{_barrier}/half_gpu"}),
        **ON_HEAD,
    )
    _two >> _half

with DAG("ray_sleeps", schedule=None, start_date=START):  # its argument and variable: secrets no Jobs API reader sees
    GpuStepOperator(
        task_id="task",
        python_callable=sleeps,
        op_args=["argument-secret-6f1e"],
        image=ImageSettings(environment={"WANDB_API_KEY": "wandb-secret-8c2d"}),
        gpu_count=1,
        **RAY,
    )

with DAG("ray_durable_sleeps", schedule=None, start_date=START):  # its job outlives a killed worker, by design
    GpuStepOperator(task_id="task", python_callable=sleeps, durable=True, **RAY)

with DAG("ray_accelerate", schedule=None, start_date=START, params={"script": "", "out": ""}):
    # accelerate's own test script, one process on each node (at world size 4 on CPU its split_between_processes
    # check fails by itself: it splits 2 rows between 4 processes and counts only GPUs as another node's)
    AccelerateOperator(
        task_id="test_script", script="{{ params.script }}", num_machines=2, num_processes=2, cpu=True, **RAY
    )
    AccelerateOperator(
        task_id="world_size_4",
        script=str(Path(__file__).resolve().parents[1] / "scripts" / "accelerate_script.py"),
        script_args=["--epochs", "2", "--out", "{{ params.out }}"],
        num_machines=2,
        num_processes=4,
        cpu=True,
        cpu_count=2,
        **RAY,
    )
    AccelerateOperator(  # node 1's rank fails once all ranks are done: node 0's is stopped, not left waiting
        task_id="node_1_fails",
        script=str(Path(__file__).resolve().parents[1] / "scripts" / "accelerate_script.py"),
        script_args=["--epochs", "1", "--out", "{{ params.out }}/fails", "--fail-rank", "1"],
        num_machines=2,
        num_processes=2,
        cpu=True,
        retries=0,
        **RAY,
    )
