"""DAGs of tests/executors/test_deferred_scheduler.py: deferred GPU tasks run by a real scheduler and triggerer.

Every task is on the GPU host's queue (:data:`QUEUE`): with ``[triggerer] queues_enabled``, its trigger runs only
in the triggerer started for that queue, the set-up docs/deferrable.md recommends (a triggerer per GPU host).
The host lists one GPU (``[gpu] devices = 0``); it has no NVIDIA runtime, which only the Docker task meets.
The functions work until the test has seen what it waits for and lets them go with a file ``go`` (:data:`GO` on the
host, ``/tmp/go`` in the container), a minute at most; each is self-contained (the provider ships its own source).
"""

from __future__ import annotations

import datetime
import os

from airflow.sdk import DAG

from airflow_gpu_provider import GpuStepOperator, ImageSettings, OomEscalation, gpu_task

START = datetime.datetime(2024, 1, 1)
QUEUE = "gpu-host-1"
IMAGE = ImageSettings(parent_image=os.environ.get("AIRFLOW_GPU_TEST_BASE_IMAGE", "airflow-gpu-base:bookworm"))
GO = os.path.join(os.environ.get("AIRFLOW_HOME", "/nonexistent"), "go")  # the cluster's home, read at parse
WAITS = {"backend": "local", "gpu_count": 1, "on_missing_gpu": "wait", "deferrable": True, "queue": QUEUE}


def holds_the_gpu(go: str) -> dict:
    """Hold the GPU until the test lets go; say which one and when."""
    import os
    import time

    started = time.time()
    print("on GPU", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not os.path.exists(go):
        time.sleep(0.2)
    return {"gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "started": started, "ended": time.time()}


# Two tasks that each need the host's only GPU: one runs, the other waits deferred in the triggerer
with DAG("sched_gpu_wait", schedule=None, start_date=START):
    for _name in ("first", "second"):
        gpu_task(task_id=_name, wait_timeout=120, **WAITS)(holds_the_gpu)(GO)

# The GPU stays busy (the test holds its lock) longer than this task may wait
with DAG("sched_gpu_wait_limit", schedule=None, start_date=START):
    gpu_task(task_id="gives_up", wait_timeout=3, **WAITS)(holds_the_gpu)(GO)


def answers(question: str) -> dict:
    """Print a line, work until the test lets go (``/tmp/go`` in the container), print another."""
    import os
    import time

    print("thinking about", question, flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not os.path.exists("/tmp/go"):
        time.sleep(0.2)
    print("the answer is ready", flush=True)
    return {"question": question, "answer": 42}


# A Docker container that runs while its task is deferred. It asks for the GPU: the host allocator gives it GPU 0,
# the engine has no NVIDIA runtime, so it runs on the CPU (on_missing_gpu="cpu") with GPU 0's lock kept for it.
with DAG("sched_docker_deferred", schedule=None, start_date=START):
    GpuStepOperator(
        task_id="task",
        python_callable=answers,
        op_args=["{{ run_id }}"],
        backend="docker",
        image=IMAGE,
        gpu_count=1,
        on_missing_gpu="cpu",
        memory="256Mi",
        on_oom=OomEscalation(memory=["512Mi"]),  # its rung is decided once, when the try starts
        deferrable=True,
        queue=QUEUE,
        backend_options={"stop_timeout": 2},
    )
