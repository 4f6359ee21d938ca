"""A training script launched by AccelerateOperator(script=...): writes what each rank saw."""

import argparse
import json
import os

import torch
from accelerate import Accelerator

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, required=True)
parser.add_argument("--out", required=True)
parser.add_argument("--fail-rank", type=int, default=-1, help="this process fails after the training, as a rank can")
args = parser.parse_args()

accelerator = Accelerator()
model = accelerator.prepare(torch.nn.Linear(4, 1))
for _ in range(args.epochs):
    accelerator.wait_for_everyone()
os.makedirs(args.out, exist_ok=True)
with open(os.path.join(args.out, f"rank{accelerator.process_index}.json"), "w") as handle:
    json.dump(
        {
            "world_size": accelerator.num_processes,
            "epochs": args.epochs,
            "rank": accelerator.process_index,
            "backend": str(accelerator.state.backend),
            "threads": [int(os.environ.get("OMP_NUM_THREADS", "0")), torch.get_num_threads()],
            "node": [os.environ.get("NODE_RANK"), os.environ.get("SLURMD_NODENAME")],
        },
        handle,
    )
if accelerator.process_index == args.fail_rank:
    raise SystemExit(f"rank {args.fail_rank} fails on purpose after its training")
