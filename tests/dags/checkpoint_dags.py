"""DAGs for tests/task/test_checkpoint_runs.py: trainings interrupted at epoch 3 of 6 on try 1, resumed on try 2.

Each DAG has the interrupted task (``retries=1``) and the same training uninterrupted, with the same seed: the test
compares their final weights. Checkpoints go under ``params.root`` (a folder of the test's own).
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG, Param

from airflow_gpu_provider import AccelerateOperator, gpu_task

START = datetime.datetime(2024, 1, 1)
EPOCHS = 6
RETRY = {"retries": 1, "retry_delay": datetime.timedelta(0)}


def train_plain(epochs: int, fail_at: int) -> dict:
    """A plain torch loop that saves its state to AIRFLOW_GPU_CHECKPOINT_DIR after each epoch and resumes from it."""
    import os

    import torch

    path = os.path.join(os.environ["AIRFLOW_GPU_CHECKPOINT_DIR"], "state.pt")
    torch.manual_seed(0)
    features = torch.randn(128, 8)
    targets = features @ torch.randn(8, 1)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    start = 0
    if os.path.exists(path):
        state = torch.load(path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"] + 1
    for epoch in range(start, epochs):
        if epoch == fail_at and start == 0:
            raise RuntimeError(f"interrupted at epoch {epoch}")
        for batch in range(0, 128, 32):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(features[batch : batch + 32]), targets[batch : batch + 32])
            loss.backward()
            optimizer.step()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, path + ".tmp")
        os.replace(path + ".tmp", path)
    weights = [*model.weight.detach().flatten().tolist(), *model.bias.detach().tolist()]
    return {"started_at": start, "weights": weights, "folder": os.environ["AIRFLOW_GPU_CHECKPOINT_DIR"]}


def train_accelerate(epochs: int, fail_at: int) -> dict:
    """A Hugging Face-style loop: automatic checkpoint naming, save_state() after each epoch, no resume code."""
    import os

    import torch
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    folder = os.environ["AIRFLOW_GPU_CHECKPOINT_DIR"]
    accelerator = Accelerator(project_config=ProjectConfiguration(project_dir=folder, automatic_checkpoint_naming=True))
    torch.manual_seed(0)
    features = torch.randn(128, 8)
    targets = features @ torch.randn(8, 1)
    dataset = torch.utils.data.TensorDataset(features, targets)
    loader = torch.utils.data.DataLoader(dataset, batch_size=16)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    start = accelerator.save_iteration  # checkpoints saved so far: the epoch to start at
    for epoch in range(start, epochs):
        if epoch == fail_at and start == 0:
            raise RuntimeError(f"interrupted at epoch {epoch}")
        for batch, target in loader:
            optimizer.zero_grad()
            accelerator.backward(torch.nn.functional.mse_loss(model(batch), target))
            optimizer.step()
        accelerator.save_state()
    unwrapped = accelerator.unwrap_model(model)
    return {
        "world_size": accelerator.num_processes,
        "started_at": start,
        "resume_step": os.environ.get("AIRFLOW_GPU_RESUME_STEP"),
        "weights": [*unwrapped.weight.detach().flatten().tolist(), *unwrapped.bias.detach().tolist()],
        "checkpoints": sorted(os.listdir(os.path.join(folder, "checkpoints"))),
        "folder": folder,
        "uri": os.environ.get("AIRFLOW_GPU_CHECKPOINT_URI"),
    }


def write_checkpoint(fail: str) -> str:
    """Writes a file into its checkpoint folder (a path, or a URI written through fsspec); fails if asked to."""
    import os

    import fsspec

    folder = os.environ["AIRFLOW_GPU_CHECKPOINT_DIR"]
    with fsspec.open(f"{folder}/state.txt", "w", auto_mkdir=True) as handle:
        handle.write("state")
    if fail == "True":
        raise RuntimeError("the run fails: its checkpoints stay")
    return folder


def graceful(seconds: float) -> str:
    """Catches SIGTERM, writes a last 'checkpoint' within the grace period, and exits."""
    import os
    import signal
    import sys
    import time

    folder = os.environ["AIRFLOW_GPU_CHECKPOINT_DIR"]

    def on_term(signum: int, frame: object) -> None:
        time.sleep(1)  # a checkpoint takes a while
        with open(os.path.join(folder, "last.txt"), "w") as handle:
            handle.write(f"saved on signal {signum}")
        sys.exit(1)

    signal.signal(signal.SIGTERM, on_term)
    with open(os.path.join(folder, "pid"), "w") as handle:
        handle.write(str(os.getpid()))
    time.sleep(seconds)
    return "not interrupted"


with DAG("checkpoint_plain", schedule=None, start_date=START, params={"root": Param("/tmp", type="string")}):
    gpu_task(task_id="interrupted", checkpoint="{{ params.root }}", **RETRY)(train_plain)(EPOCHS, 3)
    gpu_task(task_id="uninterrupted", checkpoint="{{ params.root }}")(train_plain)(EPOCHS, -1)

with DAG("checkpoint_accelerate", schedule=None, start_date=START, params={"root": Param("/tmp", type="string")}):
    resumable = gpu_task(accelerate={"num_processes": 2, "cpu": True, "resume": True}, checkpoint="{{ params.root }}")
    resumable(train_accelerate).override(task_id="interrupted", **RETRY)(EPOCHS, 3)
    AccelerateOperator(
        task_id="uninterrupted",
        python_callable=train_accelerate,
        op_args=[EPOCHS, -1],
        num_processes=2,
        cpu=True,
        resume=True,
        checkpoint="{{ params.root }}",
    )

with DAG("checkpoint_accelerate_uri", schedule=None, start_date=START, params={"root": Param("/tmp", type="string")}):
    on_uri = gpu_task(
        accelerate={"num_processes": 2, "cpu": True, "resume": True}, checkpoint="file://{{ params.root }}"
    )
    on_uri(train_accelerate).override(task_id="interrupted", **RETRY)(EPOCHS, 3)
    on_uri(train_accelerate).override(task_id="uninterrupted")(EPOCHS, -1)

with DAG("checkpoint_grace", schedule=None, start_date=START, params={"root": Param("/tmp", type="string")}):
    gpu_task(
        task_id="graceful",
        checkpoint="{{ params.root }}",
        execution_timeout=datetime.timedelta(seconds=8),
        backend_options={"kill_grace": 20},
    )(graceful)(120)

with DAG(
    "checkpoint_cleanup",
    schedule=None,
    start_date=START,
    params={"root": Param("/tmp", type="string"), "uri": Param("file:///tmp", type="string"), "fail": False},
):
    gpu_task(task_id="local_root", checkpoint="{{ params.root }}")(write_checkpoint)("False")
    gpu_task(task_id="uri_root", checkpoint="{{ params.uri }}")(write_checkpoint)("{{ params.fail }}")


def shows_its_folder() -> str:
    import os

    print("my folder:", os.environ.get("AIRFLOW_GPU_CHECKPOINT_DIR"))
    return "done"


# M4: a checkpoint URI with keys in it, as a DAG author may write one (an allowed root, set by the test)
with DAG("checkpoint_credentials", schedule=None, start_date=START, params={"root": ""}):
    gpu_task(task_id="keyed", checkpoint="{{ params.root }}", backend="local")(shows_its_folder)()
