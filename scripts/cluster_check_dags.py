"""The tasks ``make cluster-check`` runs on your cluster (scripts/cluster_check.py): one DAG per check.

The script sets ``CLUSTER_CHECK_CONN_ID`` (an Airflow connection of type ``kubernetes`` with the kubeconfig,
context and namespace), ``CLUSTER_CHECK_IMAGE`` (the tasks' image: Python 3, and torch with accelerate for the
two-node check) and, for the Kueue check, ``CLUSTER_CHECK_QUEUE``. Each task is a provider task as a DAG author
writes it; the functions import what they use inside.
"""

from __future__ import annotations

import datetime
import os

from airflow.sdk import DAG

from airflow_gpu_provider import AccelerateOperator, GpuStepOperator

START = datetime.datetime(2025, 1, 1)
OPTIONS = {"kubernetes_conn_id": os.environ.get("CLUSTER_CHECK_CONN_ID", "cluster_check"), "pending_timeout": 600}
IMAGE = {"parent_image": os.environ["CLUSTER_CHECK_IMAGE"]} if os.environ.get("CLUSTER_CHECK_IMAGE") else {}


def hello() -> dict:
    """What the pod saw: its name, Python, and a line for the log."""
    import platform
    import socket

    print(f"cluster-check: hello from {socket.gethostname()}", flush=True)  # cluster_check.MARK
    return {"hello": "cluster-check", "pod": socket.gethostname(), "python": platform.python_version()}


def sees_gpus() -> dict:
    """The GPU devices the pod was given (NVIDIA's device nodes, the visible devices)."""
    import glob
    import os

    return {
        "devices": sorted(glob.glob("/dev/nvidia[0-9]*")),
        "visible": os.environ.get("NVIDIA_VISIBLE_DEVICES") or os.environ.get("CUDA_VISIBLE_DEVICES") or "",
    }


def sleeps() -> None:
    """A task to stop while it runs (on_kill)."""
    import time

    print("cluster-check: sleeping until stopped", flush=True)
    time.sleep(3600)


def world() -> dict:
    """The world the ranks of a two-node launch form (gloo on the CPU)."""
    import socket

    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    return {"world_size": accelerator.num_processes, "node": socket.gethostname()}


def _task(dag_id: str, **arguments) -> None:
    with DAG(dag_id, schedule=None, start_date=START, catchup=False):
        operator = arguments.pop("operator", GpuStepOperator)
        options = {**OPTIONS, **arguments.pop("backend_options", {})}
        operator(task_id="check", backend="kubernetes", backend_options=options, **IMAGE, **arguments)


_task("cluster_check_cpu_pod", python_callable=hello, gpu_count=0, retries=0)
_task("cluster_check_gpu_pod", python_callable=sees_gpus, gpu_count=1, retries=0)
_task("cluster_check_deferred_pod", python_callable=hello, gpu_count=0, deferrable=True, retries=0)
_task("cluster_check_on_kill", python_callable=sleeps, gpu_count=0, retries=0)
_task(
    "cluster_check_two_nodes", operator=AccelerateOperator, python_callable=world, gpu_count=0, cpu_count=1,
    num_machines=2, num_processes=2, cpu=True, retries=0,
)  # fmt: skip
_task("cluster_check_dra", python_callable=sees_gpus, gpu_count=1, backend_options={"gpu_allocation": "dra"}, retries=0)
if os.environ.get("CLUSTER_CHECK_QUEUE"):  # the kueue check's queue, which the allow-list names for that run
    _task(
        "cluster_check_kueue", python_callable=hello, gpu_count=0, retries=0,
        backend_options={"kueue_queue": os.environ["CLUSTER_CHECK_QUEUE"]},
    )  # fmt: skip
