"""Train on a Ray cluster's GPUs: one task is one Ray job, submitted through Ray's Jobs API.

Shows the Ray backend (docs/ray.md): a whole GPU for the training, half a GPU for the evaluation (two such tasks
share one card, as Ray shares it), a requirement the cluster installs from the job's runtime_env, and the
cluster named by an Airflow connection of type ``ray`` (``ray_default``: its extra's ``address`` is the dashboard's
URL, ``http://ray-head:8265``).
"""

from __future__ import annotations

from airflow.sdk import Param, dag

from airflow_gpu_provider import ImageSettings, gpu_task
from airflow_gpu_provider.params import gpu_params

DOC = """
### Train on a Ray cluster

`train` is one Ray job asking for one GPU of the A100 or H100 nodes (Ray's `ray.io/accelerator-type` label), 4 CPUs
and 16 GiB; `scikit-learn` is installed by the cluster (`runtime_env`, uv). `evaluate` asks for half a GPU:
`gpu_count=0.5` is Ray's fractional GPU. The jobs' logs stream into the task logs; the results come back to XCom.
Set up the cluster and the `ray_default` connection as docs/ray.md says.
"""

RAY = {"backend": "ray", "backend_options": {"ray_conn_id": "ray_default"}}


@dag(
    dag_id="example_ray_gpu",
    schedule=None,
    catchup=False,
    tags=["gpu", "example", "ray"],
    doc_md=DOC,
    params={
        "epochs": Param(3, type="integer", minimum=1, description="Training epochs."),
        "batch_size": Param(64, type="integer", minimum=1, description="Mini-batch size."),
        # the backend is pinned below (so its checks run at parse time): no backend param
        **{k: v for k, v in gpu_params(gpu_count=None, on_missing_gpu="wait").items() if k != "backend"},
    },
)
def example_ray_gpu() -> None:
    """A training job and an evaluation job on Ray."""

    @gpu_task(
        accelerator=["A100", "H100"],
        cpu_count=4,
        memory="16Gi",
        image=ImageSettings(requirements=["scikit-learn>=1.4"]),
        on_missing_gpu="{{ params.on_missing_gpu }}",
        **RAY,
    )
    def train(params: dict | None = None) -> dict:
        import os

        from sklearn.linear_model import SGDRegressor

        params = params or {}
        model = SGDRegressor(max_iter=int(params.get("epochs", 3)))
        model.fit([[0.0], [1.0], [2.0]], [0.0, 1.0, 2.0])
        return {"coef": float(model.coef_[0]), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", "")}

    @gpu_task(gpu_count=0.5, cpu_count=1, **RAY)
    def evaluate(trained: dict) -> dict:
        return {"coef_ok": abs(trained["coef"] - 1.0) < 0.5}

    evaluate(train())


example_ray_gpu()
