"""A long GPU task that holds no worker slot while it runs: ``deferrable=True`` (docs/deferrable.md)."""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from airflow_gpu_provider import gpu_task
from airflow_gpu_provider.params import gpu_params

DOC = """
### Deferrable GPU task: no worker slot held while the GPU job runs

`long_job` trains for **epochs** epochs of **seconds_per_epoch** each (a long sleep standing in for the work).
With **deferrable** on, the worker starts the Docker container
(or the Kubernetes pod) and hands it to the triggerer: the task is *deferred*, holds no worker slot, and a worker
resumes it at the end to collect the result, the output and the profile. A wait for busy GPUs
(`on_missing_gpu="wait"`) is deferred too, on every backend that takes GPUs from this host (local included).

The local backend cannot defer a running task (its process is the worker's child): with **deferrable** on and
`backend="local"`, only the wait is deferred, and the run happens in the worker. When a worker is killed while the
container runs, the next try takes the container over instead of starting a second one. See docs/deferrable.md
for the triggerer set-up (`[triggerer] queues_enabled`, a triggerer per GPU host).
"""


@dag(
    dag_id="deferrable_training",
    schedule=None,
    catchup=False,
    tags=["gpu", "example", "deferrable"],
    doc_md=DOC,
    params={
        "deferrable": Param(True, type="boolean", description="Run the GPU job while the task is deferred."),
        "epochs": Param(10, type="integer", minimum=1, description="Epochs of the (simulated) training."),
        "seconds_per_epoch": Param(60, type="integer", minimum=1, description="How long one epoch sleeps."),
        "batch_size": Param(32, type="integer", minimum=1, description="Mini-batch size, printed with each epoch."),
        **gpu_params(gpu_count=1, backend="docker"),
    },
)
def deferrable_training() -> None:
    """A branch picks the deferred task or the one that holds its worker, as the trigger form says."""
    common = {
        "backend": "{{ params.backend }}",
        "gpu_count": "{{ params.gpu_count }}",
        "on_missing_gpu": "{{ params.on_missing_gpu }}",
    }

    @task.branch
    def how(params: dict | None = None) -> str:
        params = params or {}
        defers = params["backend"] != "local" or params["on_missing_gpu"] == "wait"
        return "long_job_deferred" if params["deferrable"] and defers else "long_job"

    def train(params: dict | None = None) -> dict:
        import time

        params = params or {}
        started = time.time()
        for epoch in range(int(params["epochs"])):
            time.sleep(int(params["seconds_per_epoch"]))
            print(f"epoch {epoch}: batch size {params['batch_size']}, loss {1 / (epoch + 1):.3f}", flush=True)
        return {"seconds": round(time.time() - started, 1)}

    deferred = gpu_task(task_id="long_job_deferred", deferrable=True, **common)(train)
    blocking = gpu_task(task_id="long_job", deferrable=False, **common)(train)
    how() >> [deferred(), blocking()]


deferrable_training()
