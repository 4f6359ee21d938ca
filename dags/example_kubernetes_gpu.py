"""Fine-tune on one A100 80GB in a Kubernetes pod, with an extra requirement installed at pod start.

Shows the Kubernetes backend's options (docs/kubernetes.md). Without a cluster you can still look at the pod this task
would create::

    python -m airflow_gpu_provider.render dags/example_kubernetes_gpu.py fine_tune
"""

from __future__ import annotations

from airflow.sdk import Param, dag

from airflow_gpu_provider import ImageSettings, ResourceSettings, gpu_task
from airflow_gpu_provider.params import gpu_params

DOC = """
### Fine-tune on Kubernetes

One `@gpu_task` in its own pod: one A100 80GB (node selector from NVIDIA GPU Feature Discovery labels, GPU
toleration), 8 CPUs, 64 GiB memory, a 16 GiB `/dev/shm`, and `transformers` installed by an init container at pod
start (no registry needed). The pod's traceback and the return value come back to the task log and XCom.

Review the pod before deploying: `python -m airflow_gpu_provider.render dags/example_kubernetes_gpu.py
fine_tune`.
"""


@dag(
    dag_id="example_kubernetes_gpu",
    schedule=None,
    catchup=False,
    tags=["gpu", "example", "kubernetes"],
    doc_md=DOC,
    params={
        "epochs": Param(3, type="integer", minimum=1, description="Training epochs."),
        "batch_size": Param(64, type="integer", minimum=1, description="Mini-batch size."),
        # the backend is pinned below (so its checks run at parse time): no backend param
        **{k: v for k, v in gpu_params(gpu_count=None, on_missing_gpu="fail").items() if k != "backend"},
    },
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
        backend_options={  # namespace and service account: as [gpu_policy] allowed_objects lists them
            "namespace": "ml",
            "label_scheme": "nvidia-gfd",
            "node_selector": {"node-pool": "a100"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
            "labels": {"team": "research"},
            "service_account_name": "trainer",
            "pending_timeout": 600,
        },
        on_missing_gpu="{{ params.on_missing_gpu }}",
    )
    def fine_tune(params: dict | None = None) -> dict:
        import torch
        import transformers

        params = params or {}
        device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(params.get("mixed_precision", "no"))
        model = torch.nn.Linear(16, 1).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        features, targets = torch.randn(256, 16, device=device), torch.randn(256, 1, device=device)
        batch = int(params.get("batch_size", 64))
        for _ in range(int(params.get("epochs", 3))):
            for start in range(0, len(features), batch):
                optimizer.zero_grad()
                with torch.autocast(device, dtype=dtype, enabled=dtype is not None):
                    output = model(features[start : start + batch])
                loss = torch.nn.functional.mse_loss(output.float(), targets[start : start + batch])
                loss.backward()
                optimizer.step()
        return {"loss": float(loss), "device": device, "transformers": transformers.__version__}

    fine_tune()


example_kubernetes_gpu()
