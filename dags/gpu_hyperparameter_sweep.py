"""A hyper-parameter sweep: one GPU task per learning rate, sharing the host's GPUs without oversubscription.

Dynamic task mapping fans the trials out. Each trial asks for one GPU: the scheduler starts at most as many
trials as the GPU pool has slots (``[gpu] pool``), and the host allocator gives each running trial a GPU of its
own, so two trials never share a device even when other workers use the same host.
"""

from __future__ import annotations

from airflow.sdk import Param, dag, task

from airflow_gpu_provider import ResourceSettings, gpu_task
from airflow_gpu_provider.params import gpu_params

DOC = """
### GPU hyper-parameter sweep

1. **learning_rates** reads the `learning_rates` param: one trial per value.
2. **trial** (a mapped `@gpu_task`, 1 GPU each) trains a small classifier on synthetic data with that learning
   rate and returns its accuracy. Each trial's log starts with the resource summary (`[gpu] ...` lines) that names
   the GPU it got.
3. **pick_best** returns the best trial.

**Sharing the GPUs.** With `[gpu] pool` set (`make airflow` creates the pool, sized to this host's GPUs), the
scheduler runs at most one trial per GPU at a time; the others wait in the scheduler, not on a GPU. On every
worker the host allocator hands each trial a different GPU. `on_missing_gpu=wait` also queues trials behind GPUs
that something outside Airflow holds; `cpu` runs them on the CPU instead (the default, so the example also runs on
a machine without GPUs).
"""


@dag(
    dag_id="gpu_hyperparameter_sweep",
    schedule=None,
    catchup=False,
    tags=["gpu", "example", "pytorch", "sweep"],
    doc_md=DOC,
    params={
        "learning_rates": Param(
            [0.003, 0.01, 0.03, 0.1],
            type="array",
            items={"type": "number", "exclusiveMinimum": 0},
            minItems=1,
            maxItems=64,
            description="One trial per learning rate, each on its own GPU.",
        ),
        "epochs": Param(15, type="integer", minimum=1, maximum=1000, description="Training epochs per trial."),
        "batch_size": Param(128, type="integer", minimum=1, maximum=65536, description="Mini-batch size."),
        **gpu_params(gpu_count=None),
    },
)
def gpu_hyperparameter_sweep() -> None:
    """Learning rates -> one GPU trial each -> best trial."""

    @task
    def learning_rates(params: dict | None = None) -> list[float]:
        return [float(rate) for rate in (params or {})["learning_rates"]]

    @gpu_task(
        resources=ResourceSettings(gpu_count=1, cpu_count=1),
        backend="{{ params.backend }}",
        on_missing_gpu="{{ params.on_missing_gpu }}",
    )
    def trial(learning_rate: float, params: dict | None = None) -> dict:
        import os
        import time

        import torch

        params = params or {}
        started = time.time()
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(params.get("mixed_precision", "no"))
        generator = torch.Generator().manual_seed(0)
        n_samples, n_features, n_classes = 4096, 20, 4
        centers = torch.randn(n_classes, n_features, generator=generator)
        labels = torch.randint(0, n_classes, (n_samples,), generator=generator)
        features = centers[labels] + 1.5 * torch.randn(n_samples, n_features, generator=generator)
        features, labels = features.to(device), labels.to(device)

        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(n_features, 32), torch.nn.ReLU(), torch.nn.Linear(32, n_classes)
        ).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
        batch_size = int(params.get("batch_size", 128))
        for _ in range(int(params.get("epochs", 15))):
            for start in range(0, n_samples, batch_size):
                batch = slice(start, start + batch_size)
                optimizer.zero_grad()
                with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                    loss = torch.nn.functional.cross_entropy(model(features[batch]), labels[batch])
                loss.backward()
                optimizer.step()
        with torch.no_grad():
            accuracy = float((model(features).argmax(dim=1) == labels).float().mean())
        print(f"learning rate {learning_rate}: accuracy {accuracy:.3f} on {device}")
        return {
            "learning_rate": learning_rate,
            "accuracy": accuracy,
            "device": str(device),
            "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "started": started,
            "finished": time.time(),
        }

    @task
    def pick_best(results: list[dict]) -> dict:
        best = max(results, key=lambda result: result["accuracy"])
        for result in sorted(results, key=lambda result: result["learning_rate"]):
            print(f"lr={result['learning_rate']:<8} accuracy={result['accuracy']:.3f} GPU={result['visible_devices']}")
        print(f"best: {best}")
        return best

    pick_best(trial.expand(learning_rate=learning_rates()))


gpu_hyperparameter_sweep()
