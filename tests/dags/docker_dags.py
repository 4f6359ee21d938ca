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


def count_epochs(epochs: int, fail_at: int) -> dict:
    """A stdlib 'training' that checkpoints each epoch (a file and a folder, as save_state writes) and resumes."""
    import json
    import os

    folder = os.environ["AIRFLOW_GPU_CHECKPOINT_DIR"]
    path = os.path.join(folder, "state.json")
    state = {"epoch": -1, "weights": 1.0}
    if os.path.exists(path):
        with open(path) as handle:
            state = json.load(handle)
    start = state["epoch"] + 1
    for epoch in range(start, epochs):
        if epoch == fail_at and start == 0:
            raise RuntimeError(f"interrupted at epoch {epoch}")
        state = {"epoch": epoch, "weights": state["weights"] * 1.5 + epoch}
        os.makedirs(os.path.join(folder, f"epoch_{epoch}"))
        with open(path + ".tmp", "w") as handle:
            json.dump(state, handle)
        os.replace(path + ".tmp", path)
    return {"started_at": start, "weights": state["weights"], "folder": folder, "uid": os.getuid()}


def last_words(seconds: float) -> None:
    """No SIGTERM handler of its own: the runtime's SystemExit still runs its finally block, as PID 1 too."""
    import os
    import time

    try:
        time.sleep(seconds)
    finally:
        with open(os.path.join(os.environ["AIRFLOW_GPU_CHECKPOINT_DIR"], "last.txt"), "w") as handle:
            handle.write("saved in finally")


with DAG("docker_checkpoint", schedule=None, start_date=START, params={"root": "/tmp"}):
    on_docker = {"backend": "docker", "image": IMAGE, "checkpoint": "{{ params.root }}"}
    retry = {"retries": 1, "retry_delay": datetime.timedelta(0)}
    gpu_task(task_id="interrupted", **on_docker, **retry)(count_epochs)(6, 3)
    gpu_task(task_id="uninterrupted", **on_docker)(count_epochs)(6, -1)

with DAG("docker_checkpoint_grace", schedule=None, start_date=START, params={"root": "/tmp"}):
    gpu_task(
        task_id="last_words",
        backend="docker",
        image=IMAGE,
        checkpoint="{{ params.root }}",
        execution_timeout=datetime.timedelta(seconds=8),
        backend_options={"stop_timeout": 30},
    )(last_words)(300)
