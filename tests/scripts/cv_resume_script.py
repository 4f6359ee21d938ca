"""A training script in the style of accelerate's complete_cv_example, launched by AccelerateOperator(script=...).

Synthetic images, a small CNN with dropout, shuffled train and eval loaders, AdamW and OneCycleLR, gather_for_metrics,
``save_state()`` after each epoch with automatic checkpoint naming. It resumes with the provider's one helper,
called on every try right after ``prepare``; ``--kill-at N`` ends try 1 at epoch N with ``os._exit`` (no cleanup).
Rank 0 writes what it ended with to ``--out``.
"""

import argparse
import hashlib
import json
import os

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, set_seed
from airflow_gpu_runtime import resume  # the runtime puts its archive on the script's PYTHONPATH

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, required=True)
parser.add_argument("--kill-at", type=int, default=-1)
parser.add_argument("--out", required=True)
args = parser.parse_args()

folder = os.environ["AIRFLOW_GPU_CHECKPOINT_DIR"]
accelerator = Accelerator(project_config=ProjectConfiguration(project_dir=folder, automatic_checkpoint_naming=True))
set_seed(42)
images = torch.randn(96, 3, 8, 8, generator=torch.Generator().manual_seed(0))
labels = torch.randint(0, 4, (96,), generator=torch.Generator().manual_seed(1))
data = torch.utils.data
train_dataloader = data.DataLoader(data.TensorDataset(images[:64], labels[:64]), batch_size=8, shuffle=True)
eval_dataloader = data.DataLoader(data.TensorDataset(images[64:], labels[64:]), batch_size=8, shuffle=True)
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 4, 3),
    torch.nn.ReLU(),
    torch.nn.Dropout(0.2),
    torch.nn.Flatten(),
    torch.nn.Linear(4 * 6 * 6, 4),
)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2 / 25)
lr_scheduler = torch.optim.lr_scheduler.OneCycleLR(
    optimizer, max_lr=1e-2, epochs=args.epochs, steps_per_epoch=len(train_dataloader)
)
model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
)
resumed = resume(accelerator)  # loads the newest checkpoint on a retry; 0 / nothing on a fresh start
starting_epoch = resumed.start
saved_after_resume = []
for epoch in range(starting_epoch, args.epochs):
    if epoch == args.kill_at and resumed.path is None:
        accelerator.wait_for_everyone()  # every rank's part of the last save is written (else it resumes earlier)
        print(f"killed at epoch {epoch}", flush=True)
        os._exit(9)
    model.train()
    for inputs, targets in train_dataloader:
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
    model.eval()
    correct = seen = 0
    for inputs, targets in eval_dataloader:
        with torch.no_grad():
            predictions = model(inputs).argmax(dim=-1)
        predictions, references = accelerator.gather_for_metrics((predictions, targets))
        correct, seen = correct + int((predictions == references).sum()), seen + len(references)
    accelerator.print(f"epoch {epoch}: accuracy {correct / seen:.3f}")
    saved_after_resume.append(os.path.basename(accelerator.save_state()))

if accelerator.is_main_process:
    state = accelerator.unwrap_model(model).state_dict()
    digest = hashlib.sha256(b"".join(state[k].detach().contiguous().numpy().tobytes() for k in sorted(state)))
    with open(args.out, "w") as handle:
        json.dump(
            {
                "world_size": accelerator.num_processes,
                "resumed_from": resumed.path and os.path.basename(resumed.path),
                "started_at": starting_epoch,
                "saved": saved_after_resume,
                "checkpoints": sorted(os.listdir(os.path.join(folder, "checkpoints"))),
                "sha256": digest.hexdigest(),
                "weight_sum": sum(float(v.double().sum()) for v in state.values()),
            },
            handle,
        )
