"""Fine-tune on one A100 80GB in a Kubernetes pod, with an extra requirement installed at pod start.

Shows the Kubernetes backend's options (docs/kubernetes.md). Without a cluster you can still look at the pod this task
would create::

    python -m airflow_gpu_provider.kubernetes.render dags/example_kubernetes_gpu.py fine_tune
"""

from __future__ import annotations

from airflow.sdk import Param, dag

from airflow_gpu_provider import ImageSettings, ResourceSettings, gpu_task


@dag(
    dag_id="example_kubernetes_gpu",
    schedule=None,
    catchup=False,
    tags=["gpu", "example", "kubernetes"],
    params={"epochs": Param(3, type="integer", minimum=1, description="Training epochs.")},
)
def example_kubernetes_gpu() -> None:
    """One GPU task on Kubernetes."""

    @gpu_task(
        backend="kubernetes",
        resources=ResourceSettings(accelerator="A100-80GB:1", cpu_count=8, memory="64Gi", shm_size="16Gi"),
        image=ImageSettings(
            parent_image="pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
            requirements=["transformers==4.46.0"],
        ),
        backend_options={
            "namespace": "ml",
            "label_scheme": "nvidia-gfd",
            "node_selector": {"node-pool": "a100"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
            "labels": {"team": "research"},
            "service_account_name": "trainer",
            "pending_timeout": 600,
        },
        on_missing_gpu="fail",
    )
    def fine_tune(params: dict | None = None) -> dict:
        import torch
        import transformers

        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = torch.nn.Linear(16, 1).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        features, targets = torch.randn(256, 16, device=device), torch.randn(256, 1, device=device)
        for _ in range((params or {}).get("epochs", 3)):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(features), targets)
            loss.backward()
            optimizer.step()
        return {"loss": float(loss), "device": device, "transformers": transformers.__version__}

    fine_tune()


example_kubernetes_gpu()
