"""Data-parallel training with 🤗 Accelerate: one process per GPU, on any backend.

The function runs on every rank under ``accelerate launch``; rank 0's return value goes to XCom. Without GPUs
(``on_missing_gpu="cpu"``) the same number of processes run on CPU with gloo, so the DAG runs anywhere.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from airflow_gpu_provider import ResourceSettings, gpu_task
from airflow_gpu_provider.params import gpu_params

DOC = """
### Accelerate training

`train` is `@gpu_task(accelerate={...})`: it asks for `gpu_count` GPUs and `accelerate launch` starts one process
per GPU (`num_processes` defaults to the GPUs requested). Each rank trains on its shard of a synthetic regression
set through a real `Accelerator` loop; gradients are averaged across ranks. The task log shows the exact
`accelerate launch` command line and each rank's finish line; XCom holds the world size the ranks saw, the loss
curve and the device.

Launch options are checked when the DAG is parsed by accelerate's own argument parser: a typo such as
`num_procs=2` is an import error naming the option.
"""


@dag(
    dag_id="accelerate_training",
    schedule=None,
    catchup=False,
    tags=["gpu", "example", "accelerate", "pytorch"],
    doc_md=DOC,
    params={
        "epochs": Param(5, type="integer", minimum=1, maximum=200, description="Passes over the training set."),
        "batch_size": Param(32, type="integer", minimum=1, description="Mini-batch size per process."),
        **gpu_params(gpu_count=2),
    },
)
def accelerate_training() -> None:
    """Synthetic data -> data-parallel training -> report."""

    @gpu_task(
        resources=ResourceSettings(cpu_count=2, memory="8Gi", shm_size="2Gi"),
        gpu_count="{{ params.gpu_count }}",
        backend="{{ params.backend }}",
        on_missing_gpu="{{ params.on_missing_gpu }}",
        accelerate=True,  # or a dict of launch options: {"mixed_precision": "bf16", "dynamo_backend": ...}
    )
    def train(params: dict | None = None) -> dict:
        import torch
        from accelerate import Accelerator

        params = params or {}
        accelerator = Accelerator(mixed_precision=params.get("mixed_precision", "no"))
        torch.manual_seed(0)
        features = torch.randn(4096, 32)
        targets = features @ torch.randn(32, 1) + 0.05 * torch.randn(4096, 1)
        dataset = torch.utils.data.TensorDataset(features, targets)
        loader = torch.utils.data.DataLoader(dataset, batch_size=int(params.get("batch_size", 32)), shuffle=True)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        curve = []
        for epoch in range(int(params.get("epochs", 5))):
            total = torch.zeros(1, device=accelerator.device)
            for batch, target in loader:
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(batch), target)
                accelerator.backward(loss)
                optimizer.step()
                total += loss.detach()
            curve.append(float(accelerator.gather(total / len(loader)).mean()))
            accelerator.print(f"epoch {epoch + 1}: loss {curve[-1]:.4f}")
        return {
            "world_size": accelerator.num_processes,
            "device": str(accelerator.device),
            "mixed_precision": accelerator.mixed_precision,
            "loss_curve": curve,
        }

    @task
    def report(metrics: dict) -> dict:
        if not metrics["loss_curve"][-1] < metrics["loss_curve"][0]:
            raise ValueError(f"training did not reduce the loss: {metrics}")
        print(
            f"{metrics['world_size']} processes on {metrics['device']}: loss {metrics['loss_curve'][0]:.4f} -> "
            f"{metrics['loss_curve'][-1]:.4f}"
        )
        return metrics

    report(train())


accelerate_training()
