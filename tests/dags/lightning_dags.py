"""PyTorch Lightning inside @task.gpu: ``strategy="ddp"`` on 2 CPU devices (each other rank runs the task process
again), and ``ddp_spawn`` with its model in a module next to this file; lightning comes as an injected requirement.
"""

from __future__ import annotations

import datetime

from airflow.sdk import DAG

from airflow_gpu_provider import ImageSettings, gpu_task

START = datetime.datetime(2024, 1, 1)
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
