"""DAGs of the reattach tests: a Docker task and a Slurm task (tests/executors/test_reattach.py) and a Ray task
(tests/backends/ray/test_ray_reattach.py) whose Celery worker is SIGKILLed while its container or job runs."""

from __future__ import annotations

import datetime
import os

from airflow.sdk import DAG

from airflow_gpu_provider import GpuStepOperator, ImageSettings

IMAGE = ImageSettings(parent_image=os.environ.get("AIRFLOW_GPU_TEST_BASE_IMAGE", "airflow-gpu-base:bookworm"))


def counts_its_runs(seconds: str) -> dict:
    """Append a line to the checkpoint folder for every process that runs this; return how many did.

    It works ``seconds`` at most: until the test has seen what it waited for and put a file ``go`` in the folder.
    """
    import os
    import time

    folder = os.environ["AIRFLOW_GPU_CHECKPOINT_DIR"]
    with open(os.path.join(folder, "runs.txt"), "a") as handle:
        handle.write(f"{os.getpid()}\n")
    print("counted; working", flush=True)
    deadline = time.monotonic() + int(seconds)
    while time.monotonic() < deadline and not os.path.exists(os.path.join(folder, "go")):
        time.sleep(0.2)
    with open(os.path.join(folder, "runs.txt")) as handle:
        runs = len(handle.read().split())
    print("done after", runs, "run(s)", flush=True)
    return {"runs": runs}


# tests/executors/test_reattach.py: the Docker and the Slurm task (on the tests' cluster), side by side;
# tests/backends/ray/test_ray_reattach.py: the Ray job (the ray_default connection: tests/backends/ray/ray_cluster.py)
BACKENDS = {
    "reattach_after_worker_kill": {"backend": "docker", "image": IMAGE, "backend_options": {"stop_timeout": 2}},
    "reattach_ray_after_worker_kill": {"backend": "ray"},
    "reattach_slurm_after_worker_kill": {"backend": "slurm", "backend_options": {"slurm_conn_id": "slurm_test"}},
}
for _dag_id, _backend in BACKENDS.items():
    with DAG(
        _dag_id,
        schedule=None,
        start_date=datetime.datetime(2024, 1, 1),
        params={"root": "/tmp", "seconds": 45},
        default_args={"retries": 1, "retry_delay": datetime.timedelta(seconds=0)},
    ):
        GpuStepOperator(
            task_id="task",
            python_callable=counts_its_runs,
            op_args=["{{ params.seconds }}"],
            checkpoint="{{ params.root }}",
            **_backend,
        )
