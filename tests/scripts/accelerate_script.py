"""A training script launched by AccelerateOperator(script=...): writes what each rank saw."""

import argparse
import json
import os

import torch
from accelerate import Accelerator

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, required=True)
parser.add_argument("--out", required=True)
args = parser.parse_args()

accelerator = Accelerator()
model = accelerator.prepare(torch.nn.Linear(4, 1))
for _ in range(args.epochs):
    accelerator.wait_for_everyone()
with open(os.path.join(args.out, f"rank{accelerator.process_index}.json"), "w") as handle:
    json.dump(
        {
            "world_size": accelerator.num_processes,
            "epochs": args.epochs,
            "rank": accelerator.process_index,
            "backend": str(accelerator.state.backend),
            "threads": [int(os.environ.get("OMP_NUM_THREADS", "0")), torch.get_num_threads()],
        },
        handle,
    )
