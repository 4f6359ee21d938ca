"""PyTorch Lightning inside @task.gpu: ``strategy="ddp"`` on 2 CPU devices (each other rank runs the task process
again), and ``ddp_spawn`` with its model in a module next to this file; lightning comes as an injected requirement.
``lightning_resume``: a ``ddp`` training whose rank 1 is killed on try 1 resumes from ``last.ckpt`` on try 2.
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG, Param

from airflow_gpu_provider import ImageSettings, gpu_task

START = datetime.datetime(2024, 1, 1)
RETRY = {"retries": 1, "retry_delay": datetime.timedelta(0)}
LIGHTNING = ImageSettings(requirements=["lightning==2.6.6"])  # a venv over the worker's torch


def train_ddp(devices: int) -> dict:
    """The model is defined inside the function: ``ddp`` runs this function again in each other rank."""
    import os

    import lightning
    import torch

    class Tiny(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)
            self.seen: dict = {}

        def training_step(self, batch, batch_index):
            features, targets = batch
            loss = torch.nn.functional.mse_loss(self.layer(features), targets)
            self.log("loss", loss, sync_dist=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

        def on_train_end(self) -> None:
            pids = self.all_gather(torch.tensor([os.getpid()])).flatten().tolist()
            self.seen = {"process_group_size": torch.distributed.get_world_size(), "pids": pids}

    generator = torch.Generator().manual_seed(0)
    features = torch.randn(256, 8, generator=generator)
    targets = features @ torch.randn(8, 1, generator=generator)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(features, targets), batch_size=32)
    model = Tiny()
    trainer = lightning.Trainer(
        accelerator="cpu", devices=devices, strategy="ddp", max_epochs=2, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(model, loader)
    return {
        "global_rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "pid": os.getpid(),
        "loss": float(trainer.callback_metrics["loss"]),
        **model.seen,
    }


def train_ddp_spawn(devices: int) -> dict:
    """``ddp_spawn`` pickles the model for its spawned ranks: its class lives in a module next to the DAG file."""
    import lightning
    from tiny_lightning import TinyRegressor, data

    model = TinyRegressor()
    trainer = lightning.Trainer(
        accelerator="cpu", devices=devices, strategy="ddp_spawn", max_epochs=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(model, data())
    return {"world_size": trainer.world_size, "loss": float(trainer.callback_metrics["loss"])}


with DAG("lightning_ddp", schedule=None, start_date=START):
    gpu_task(task_id="ddp", image=LIGHTNING, cpu_count=2)(train_ddp)(2)
    gpu_task(task_id="ddp_spawn", image=LIGHTNING, cpu_count=2)(train_ddp_spawn)(2)


def train_resumable(kill_at: int) -> dict:
    """Checkpoints into the task's folder; on a retry, ``trainer.fit`` resumes from the one the runtime found."""
    import hashlib
    import os
    import signal

    import lightning
    import torch

    resume_from = os.environ.get("AIRFLOW_GPU_RESUME_FROM")

    class Tiny(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_index):
            features, targets = batch
            return torch.nn.functional.mse_loss(self.layer(features), targets)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

        def on_train_epoch_start(self) -> None:
            if self.current_epoch == kill_at and resume_from is None and self.global_rank == 1:
                print(f"rank 1 killed at epoch {kill_at}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer ends a rank

    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(128, 8, generator=generator)
    targets = features @ torch.randn(8, 1, generator=generator)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(features, targets), batch_size=16)
    model = Tiny()
    checkpoints = lightning.pytorch.callbacks.ModelCheckpoint(dirpath=os.environ["AIRFLOW_GPU_CHECKPOINT_DIR"],
                                                              save_last=True)  # fmt: skip
    trainer = lightning.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=4, logger=False, callbacks=[checkpoints],
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(model, loader, ckpt_path=resume_from)
    state = model.state_dict()
    digest = hashlib.sha256(b"".join(state[k].detach().contiguous().numpy().tobytes() for k in sorted(state)))
    return {"resumed_from": resume_from and os.path.basename(resume_from), "sha256": digest.hexdigest()}


with DAG("lightning_resume", schedule=None, start_date=START, params={"root": Param("/tmp", type="string")}):
    resumable = gpu_task(image=LIGHTNING, cpu_count=2, checkpoint="{{ params.root }}", resume=True)
    resumable(train_resumable).override(task_id="interrupted", **RETRY)(2)
    resumable(train_resumable).override(task_id="uninterrupted")(-1)
