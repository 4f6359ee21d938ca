"""A training that survives its own failure: checkpoints each epoch, and the retry resumes where try 1 stopped.

Trigger it with ``fail_at_epoch`` set (e.g. 3): try 1 fails on purpose at that epoch (by default running out of
memory), Airflow retries, and try 2's log shows ``[gpu] try 2: OOM escalation ...`` (the next step of its
``on_oom`` ladder) and ``[gpu] resume: from .../checkpoint_2 (step 2)``: it trains epochs 3 to the end only, with
the model, optimizer and RNG states of the end of epoch 2.
"""

from __future__ import annotations

import datetime

from airflow.sdk import Param, dag, task

from airflow_gpu_provider import OomEscalation, ResourceSettings, gpu_task
from airflow_gpu_provider.params import gpu_params

DOC = """
### Resilient training: checkpoint and resume

`train` is `@gpu_task(accelerate={"resume": True}, retries=2)`. Every try of it sees the same checkpoint folder,
`AIRFLOW_GPU_CHECKPOINT_DIR` (under `[gpu] checkpoint_root`; by default on the worker,
`<state_dir>/checkpoints/<dag>/<run>/<task>`). The loop saves with `accelerator.save_state()` after each epoch
(`checkpoints/checkpoint_<epoch>`) and starts at `accelerator.save_iteration`. On a retry, the provider loads the
newest checkpoint right after the loop's `accelerator.prepare(...)`, with the shuffled loader's pass and shuffling
state, so the loop carries on from there, exactly as an uninterrupted run would, with no resume code of its own.

`train` also has an `on_oom` ladder: after running out of host memory the next try gets 16 GiB instead of 8 GiB,
after running out of GPU memory a GPU with more memory (local and Docker: a larger free GPU of the host; a host
with none fails at once, saying so).

Set **fail_at_epoch** to make try 1 fail at that epoch on purpose, and **failure** to choose how (`host_oom`: a
`MemoryError`, `gpu_oom`: torch's `OutOfMemoryError`, `error`: any other error, retried unchanged). Then look at
try 2's log, at the XCom of `train` (`started_at_epoch` is where try 2 began, `memory` what it ran with) and at
its `gpu_escalation` XCom (the tries and how each ended). When the run succeeds its checkpoints are deleted
(`[gpu] checkpoint_cleanup`). See docs/resilience.md.
"""


@dag(
    dag_id="resilient_training",
    schedule=None,
    catchup=False,
    tags=["gpu", "example", "accelerate", "resilience"],
    doc_md=DOC,
    params={
        "epochs": Param(6, type="integer", minimum=1, maximum=200, description="Passes over the training set."),
        "batch_size": Param(32, type="integer", minimum=1, description="Mini-batch size per process."),
        "fail_at_epoch": Param(
            -1, type="integer", minimum=-1, description="Try 1 fails on purpose at this epoch (-1: never)."
        ),
        "failure": Param(
            "host_oom",
            enum=["host_oom", "gpu_oom", "error"],
            description="How try 1 fails: out of host memory, out of GPU memory, or another error.",
        ),
        **gpu_params(gpu_count=1),
    },
)
def resilient_training() -> None:
    """A checkpointed training -> report."""

    @gpu_task(
        resources=ResourceSettings(cpu_count=2, memory="8Gi", shm_size="2Gi"),
        gpu_count="{{ params.gpu_count }}",
        backend="{{ params.backend }}",
        on_missing_gpu="{{ params.on_missing_gpu }}",
        accelerate={"resume": True},
        on_oom=OomEscalation(memory=["16Gi"]),  # and, after a GPU OOM, a GPU with more memory
        retries=2,
        retry_delay=datetime.timedelta(seconds=5),
    )
    def train(params: dict | None = None) -> dict:
        import json
        import os

        import torch
        from accelerate import Accelerator
        from accelerate.utils import ProjectConfiguration

        params = params or {}
        accelerator = Accelerator(
            mixed_precision=params.get("mixed_precision", "no"),
            project_config=ProjectConfiguration(
                project_dir=os.environ["AIRFLOW_GPU_CHECKPOINT_DIR"], automatic_checkpoint_naming=True, total_limit=3
            ),
        )
        torch.manual_seed(0)
        features = torch.randn(4096, 32)
        targets = features @ torch.randn(32, 1) + 0.05 * torch.randn(4096, 1)
        dataset = torch.utils.data.TensorDataset(features, targets)
        loader = torch.utils.data.DataLoader(dataset, batch_size=int(params.get("batch_size", 32)), shuffle=True)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)  # a retry resumes here
        start, curve = accelerator.save_iteration, []
        for epoch in range(start, int(params.get("epochs", 6))):
            if epoch == int(params.get("fail_at_epoch", -1)) and start == 0:
                why = f"failing on purpose at epoch {epoch} (fail_at_epoch): the retry resumes here"
                kinds = {"host_oom": MemoryError, "gpu_oom": torch.OutOfMemoryError, "error": RuntimeError}
                raise kinds[params.get("failure", "host_oom")](why)
            total = torch.zeros(1, device=accelerator.device)
            for batch, target in loader:
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(batch), target)
                accelerator.backward(loss)
                optimizer.step()
                total += loss.detach()
            curve.append(float(accelerator.gather(total / len(loader)).mean()))
            accelerator.print(f"epoch {epoch}: loss {curve[-1]:.4f}")
            accelerator.save_state()
        memory = json.loads(os.environ["AIRFLOW_GPU_RESOURCES"])["memory"]
        return {
            "world_size": accelerator.num_processes,
            "started_at_epoch": start,
            "memory": memory,
            "loss_curve": curve,
        }

    @task
    def report(metrics: dict) -> dict:
        print(f"started at epoch {metrics['started_at_epoch']}; loss curve {metrics['loss_curve']}")
        return metrics

    report(train())


resilient_training()
