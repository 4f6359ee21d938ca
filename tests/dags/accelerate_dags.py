"""DAGs for tests/operators/test_accelerate.py: real `accelerate launch` runs with 2 CPU processes (gloo)."""

from __future__ import annotations

import datetime
from pathlib import Path

from airflow.sdk import DAG

from airflow_gpu_provider import AccelerateOperator, ResourceSettings, gpu_task

START = datetime.datetime(2024, 1, 1)
SCRIPT = str(Path(__file__).resolve().parents[1] / "scripts" / "accelerate_script.py")


def train_with_accelerator(epochs: int, lr: float = 0.05) -> dict:
    import os

    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    torch.manual_seed(0)
    features = torch.randn(256, 8)
    targets = features @ torch.randn(8, 1) + 0.01 * torch.randn(256, 1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(features, targets), batch_size=32)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for _ in range(epochs):
        for batch, target in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(batch), target)
            accelerator.backward(loss)
            optimizer.step()
        losses.append(float(accelerator.gather(loss.detach()).mean()))
    ranks = accelerator.gather(torch.tensor([accelerator.process_index])).tolist()
    omp = int(os.environ.get("OMP_NUM_THREADS", "0"))  # the threads each rank was given, and what torch uses
    threads = accelerator.gather(torch.tensor([[omp, torch.get_num_threads()]])).tolist()
    return {
        "world_size": accelerator.num_processes,
        "ranks": ranks,
        "threads": threads,
        "pids_differ": len(set(accelerator.gather(torch.tensor([os.getpid()])).tolist())) == accelerator.num_processes,
        "backend": str(accelerator.state.backend),
        "device": str(accelerator.device),
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }


def one_rank_dies(pid_dir: str) -> None:
    import os
    import signal
    import time

    from accelerate import Accelerator

    accelerator = Accelerator()
    with open(os.path.join(pid_dir, f"rank{accelerator.process_index}"), "w") as handle:
        handle.write(str(os.getpid()))
    if accelerator.process_index == 1:
        time.sleep(1)
        os.kill(os.getpid(), signal.SIGKILL)
    accelerator.wait_for_everyone()  # rank 0 blocks on the dead rank until the launcher tears it down
    time.sleep(300)


def one_rank_raises() -> None:
    from accelerate import Accelerator

    accelerator = Accelerator()
    if accelerator.process_index == 1:
        raise RuntimeError("rank 1 cannot go on")
    accelerator.wait_for_everyone()


with DAG("accelerate_callable", schedule=None, start_date=START):
    train = gpu_task(accelerate={"num_processes": 2, "cpu": True}, cpu_count=2)(train_with_accelerator)
    AccelerateOperator(
        task_id="train_operator",
        python_callable=train_with_accelerator,
        op_kwargs={"epochs": 2},
        cpu=True,
        num_processes=2,
        mixed_precision="no",
        cpu_count=4,  # not enforced by the local backend: 2 threads for each of the 2 ranks
    )
    train(3)

with DAG("accelerate_script", schedule=None, start_date=START, params={"out": ""}):
    AccelerateOperator(
        task_id="script",
        script=SCRIPT,
        script_args=["--epochs", "2", "--out", "{{ params.out }}"],
        cpu=True,
        num_processes=2,
        cpu_count=4,
    )

with DAG("accelerate_failures", schedule=None, start_date=START, params={"pid_dir": ""}):
    AccelerateOperator(
        task_id="killed_rank",
        python_callable=one_rank_dies,
        op_kwargs={"pid_dir": "{{ params.pid_dir }}"},
        cpu=True,
        num_processes=2,
        execution_timeout=datetime.timedelta(minutes=3),
    )
    AccelerateOperator(task_id="raising_rank", python_callable=one_rank_raises, cpu=True, num_processes=2)

# Docker: the default parent image (the test builds base + torch + accelerate and sets it)
with DAG("accelerate_docker", schedule=None, start_date=START):
    AccelerateOperator(
        task_id="train",
        python_callable=train_with_accelerator,
        op_kwargs={"epochs": 2},
        backend="docker",
        gpu_count=2,
        on_missing_gpu="cpu",
        cpu_count=2,
        memory="4Gi",
    )

# Kubernetes: rendered only (no cluster here); tests/backends/kubernetes/test_k8s_accelerate.py
with DAG("accelerate_kubernetes", schedule=None, start_date=START):
    AccelerateOperator(
        task_id="two_nodes",
        python_callable=train_with_accelerator,
        op_kwargs={"epochs": 2},
        backend="kubernetes",
        num_machines=2,
        mixed_precision="bf16",
        resources=ResourceSettings(accelerator="A100:4", cpu_count=16, memory="128Gi", shm_size="32Gi"),
        backend_options={"namespace": "ml"},
    )
    AccelerateOperator(
        task_id="two_cpu_nodes",
        python_callable=train_with_accelerator,
        op_kwargs={"epochs": 2},
        backend="kubernetes",
        num_machines=2,
        cpu=True,
        num_processes=2,
        backend_options={"namespace": "ml"},
    )  # image: the default parent image
