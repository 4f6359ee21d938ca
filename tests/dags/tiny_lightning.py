"""A PyTorch Lightning model in a module next to the test DAG files, so ``ddp_spawn`` can pickle it by name.

Imported only inside tasks (torch and lightning are the task's, not the parser's).
"""

from __future__ import annotations

import os

import lightning
import torch


class TinyRegressor(lightning.LightningModule):
    """A linear model; at the end of training it gathers every rank's pid and the process group's size."""

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
        threads = self.all_gather(torch.tensor([torch.get_num_threads()])).flatten().tolist()
        self.seen = {
            "process_group_size": torch.distributed.get_world_size(),
            "pids": pids,
            "threads": threads,
            "rank": self.global_rank,
        }


def data(samples: int = 256) -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(samples, 8, generator=generator)
    targets = features @ torch.randn(8, 1, generator=generator)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(features, targets), batch_size=32)
