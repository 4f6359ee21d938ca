"""accelerate's complete_cv_example, checkpointing both ways at once: ``step_{n}`` every ``--checkpointing-steps`` and
``epoch_{n}`` after each epoch, into the task's checkpoint folder, as the example names them.

It resumes as the example does from ``--resume_from_checkpoint`` (the folder the runtime found,
``AIRFLOW_GPU_RESUME_FROM``): the epoch or step after the one in the folder's name, loaded with the provider's
helper so that the shuffled loaders resume too. ``--kill-at N`` ends try 1 with ``os._exit`` right after saving
``epoch_{N}``. Rank 0 writes what it ended with to ``--out``.
"""

import argparse
import hashlib
import json
import os

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from airflow_gpu_runtime import resume  # the runtime puts its archive on the script's PYTHONPATH

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, required=True)
parser.add_argument("--checkpointing-steps", type=int, required=True)
parser.add_argument("--kill-at", type=int, default=-1)
parser.add_argument("--out", required=True)
args = parser.parse_args()

output_dir = os.environ["AIRFLOW_GPU_CHECKPOINT_DIR"]
accelerator = Accelerator()
set_seed(42)
images = torch.randn(64, 3, 8, 8, generator=torch.Generator().manual_seed(0))
labels = torch.randint(0, 4, (64,), generator=torch.Generator().manual_seed(1))
data = torch.utils.data
train_dataloader = data.DataLoader(data.TensorDataset(images[:48], labels[:48]), batch_size=6, shuffle=True)
eval_dataloader = data.DataLoader(data.TensorDataset(images[48:], labels[48:]), batch_size=8)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(144, 4))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2 / 25)
lr_scheduler = torch.optim.lr_scheduler.OneCycleLR(
    optimizer, max_lr=1e-2, epochs=args.epochs, steps_per_epoch=len(train_dataloader)
)
model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
)
resumed = resume(accelerator)  # accelerator.load_state(args.resume_from_checkpoint), the loaders' state too
overall_step, starting_epoch, resume_step = 0, 0, None
if resumed.path:  # "Extract `epoch_{i}` or `step_{i}`", as the example does
    training_difference = os.path.basename(resumed.path)
    if "epoch" in training_difference:
        starting_epoch = int(training_difference.replace("epoch_", "")) + 1
    else:
        resume_step = int(training_difference.replace("step_", ""))
        starting_epoch = resume_step // len(train_dataloader)
        resume_step -= starting_epoch * len(train_dataloader)
    overall_step = starting_epoch * len(train_dataloader)
for epoch in range(starting_epoch, args.epochs):
    model.train()
    if resume_step is not None and epoch == starting_epoch:
        active_dataloader = accelerator.skip_first_batches(train_dataloader, resume_step)
        overall_step += resume_step
    else:
        active_dataloader = train_dataloader
    for inputs, targets in active_dataloader:
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
        overall_step += 1
        if overall_step % args.checkpointing_steps == 0:
            accelerator.save_state(os.path.join(output_dir, f"step_{overall_step}"))
    model.eval()
    for inputs, _ in eval_dataloader:
        with torch.no_grad():
            accelerator.gather_for_metrics(model(inputs).argmax(dim=-1))
    accelerator.save_state(os.path.join(output_dir, f"epoch_{epoch}"))
    if epoch == args.kill_at and resumed.path is None:
        accelerator.wait_for_everyone()
        accelerator.print(f"killed after saving epoch_{epoch}", flush=True)
        os._exit(9)

if accelerator.is_main_process:
    state = accelerator.unwrap_model(model).state_dict()
    digest = hashlib.sha256(b"".join(state[k].detach().contiguous().numpy().tobytes() for k in sorted(state)))
    with open(args.out, "w") as handle:
        json.dump(
            {
                "resumed_from": resumed.path and os.path.basename(resumed.path),
                "started_at": starting_epoch,
                "checkpoints": sorted(os.listdir(output_dir)),
                "sha256": digest.hexdigest(),
            },
            handle,
        )
