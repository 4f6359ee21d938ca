"""The script both contenders of benchmarks/accelerate_launch.py launch: a small data-parallel training run."""

import torch
from accelerate import Accelerator

accelerator = Accelerator()
torch.manual_seed(0)
features, targets = torch.randn(8192, 64), torch.randn(8192, 1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(features, targets), batch_size=64)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for _ in range(3):
    for batch, target in loader:
        optimizer.zero_grad()
        accelerator.backward(torch.nn.functional.mse_loss(model(batch), target))
        optimizer.step()
accelerator.print(f"world size {accelerator.num_processes}")
