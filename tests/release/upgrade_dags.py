"""DAGs of tests/release/test_upgrade.py: Docker tasks that the previous release starts and this one finishes.

Written for both releases: only arguments the previous one takes.
"""

from __future__ import annotations

import datetime
import os

from airflow.sdk import DAG

from airflow_gpu_provider import GpuStepOperator, ImageSettings

IMAGE = ImageSettings(parent_image=os.environ.get("AIRFLOW_GPU_TEST_BASE_IMAGE", "airflow-gpu-base:bookworm"))
START = datetime.datetime(2024, 1, 1)
RETRY = {"retries": 1, "retry_delay": datetime.timedelta(seconds=0)}


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


def _task(task_id: str, **arguments) -> GpuStepOperator:
    return GpuStepOperator(
        task_id=task_id, python_callable=counts_its_runs, op_args=["{{ params.seconds }}"],
        checkpoint="{{ params.root }}", backend="docker", image=IMAGE, backend_options={"stop_timeout": 2},
        **arguments,
    )  # fmt: skip


# started by the previous release, its worker killed and its triggerer stopped; finished by this one. Its functions
# work until the test lets them go; 300 s at most (a 60 s cap can end them before the takeover under load)
with DAG("upgrade_story", schedule=None, start_date=START, params={"root": "/tmp", "seconds": 300}, default_args=RETRY):
    _task("deferred", deferrable=True)
    _task("durable", durable=True)

# a worker of each release side by side (each on its own queue), this release's scheduler and triggerer
with DAG(
    "upgrade_mixed_fleet", schedule=None, start_date=START, params={"root": "/tmp", "seconds": 3}, default_args=RETRY
):
    for release in ("previous", "this"):
        _task(f"deferred_on_{release}", deferrable=True, queue=release)
        _task(f"durable_on_{release}", durable=True, queue=release)
