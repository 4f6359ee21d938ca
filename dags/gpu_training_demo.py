"""Train a tiny PyTorch model on synthetic data, on a GPU when there is one.

Trigger it from the UI and change the params: the same DAG runs on the local backend (a child process holding the
GPUs it was given) or on any backend the form's ``backend`` lists. With ``on_missing_gpu="cpu"`` it also runs on a
machine without GPUs, with a warning in the log.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from airflow_gpu_provider import ResourceSettings, gpu_task
from airflow_gpu_provider.params import gpu_params

DOC = """
### GPU training demo

1. **make_dataset** describes a synthetic regression problem (features, samples, seed).
2. **train** is a `@gpu_task`: it asks for `gpu_count` GPUs, runs in its own process with exactly those GPUs
   visible (`CUDA_VISIBLE_DEVICES`), trains a small MLP for `epochs` epochs and returns its metrics to XCom.
   Its log starts with a resource summary: backend, GPUs assigned, image/requirements hash, CUDA cache result.
3. **report** checks that the loss went down and prints the metrics.

Params: `gpu_count`, `epochs`, `batch_size`, `mixed_precision` (no | bf16 | fp16), `backend` (every backend a
template may choose; its description says where each runs) and `on_missing_gpu` (fail | wait | cpu).
"""


@dag(
    dag_id="gpu_training_demo",
    schedule=None,
    catchup=False,
    tags=["gpu", "example", "pytorch"],
    doc_md=DOC,
    params={
        "epochs": Param(20, type="integer", minimum=1, maximum=1000, description="Training epochs."),
        "batch_size": Param(64, type="integer", minimum=1, maximum=65536, description="Mini-batch size."),
        **gpu_params(gpu_count=1),
    },
)
def gpu_training_demo() -> None:
    """Dataset spec -> GPU training -> report."""

    @task
    def make_dataset() -> dict:
        return {"n_samples": 2048, "n_features": 16, "seed": 0}

    @gpu_task(
        resources=ResourceSettings(cpu_count=2, memory="4Gi"),
        gpu_count="{{ params.gpu_count }}",
        backend="{{ params.backend }}",
        on_missing_gpu="{{ params.on_missing_gpu }}",
    )
    def train(dataset: dict, params: dict | None = None) -> dict:
        import time

        import torch

        params = params or {}
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        generator = torch.Generator().manual_seed(dataset["seed"])
        features = torch.randn(dataset["n_samples"], dataset["n_features"], generator=generator)
        true_weights = torch.randn(dataset["n_features"], 1, generator=generator)
        targets = features @ true_weights + 0.1 * torch.randn(dataset["n_samples"], 1, generator=generator)
        features, targets = features.to(device), targets.to(device)

        torch.manual_seed(dataset["seed"])
        model = torch.nn.Sequential(
            torch.nn.Linear(dataset["n_features"], 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
        ).to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        loss_fn = torch.nn.MSELoss()
        batch_size = int(params.get("batch_size", 64))
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(params.get("mixed_precision", "no"))

        def full_loss() -> float:
            with torch.no_grad():
                return float(loss_fn(model(features), targets))

        initial_loss = full_loss()
        started = time.perf_counter()
        compute_dtype = None  # what the forward pass really computed in (bfloat16 under bf16 autocast)
        for epoch in range(int(params.get("epochs", 20))):
            order = torch.randperm(dataset["n_samples"], device=device)
            for start in range(0, dataset["n_samples"], batch_size):
                batch = order[start : start + batch_size]
                optimizer.zero_grad()
                with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                    output = model(features[batch])
                    loss = loss_fn(output, targets[batch])
                compute_dtype = str(output.dtype).removeprefix("torch.")
                loss.backward()
                optimizer.step()
            print(f"epoch {epoch + 1}: loss {full_loss():.4f}")
        return {
            "initial_loss": initial_loss,
            "final_loss": full_loss(),
            "epochs": int(params.get("epochs", 20)),
            "batch_size": batch_size,
            "mixed_precision": params.get("mixed_precision", "no"),
            "compute_dtype": compute_dtype,
            "device": str(device),
            "gpu_name": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
            "train_seconds": round(time.perf_counter() - started, 3),
        }

    @task
    def report(metrics: dict) -> dict:
        if not metrics["final_loss"] < metrics["initial_loss"]:
            raise ValueError(f"training did not reduce the loss: {metrics}")
        print(
            f"Trained {metrics['epochs']} epochs on {metrics['device']}: "
            f"loss {metrics['initial_loss']:.4f} -> {metrics['final_loss']:.4f}"
        )
        return metrics

    report(train(make_dataset()))


gpu_training_demo()
