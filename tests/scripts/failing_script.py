"""A training script that fails as scripts do: ``--raise`` raises on every rank, ``--kill-rank N`` is SIGKILLed."""

import argparse
import os
import signal
import time

parser = argparse.ArgumentParser()
parser.add_argument("--raise", dest="raise_", action="store_true")
parser.add_argument("--kill-rank", type=int, default=None)
parser.add_argument("--pid-dir", default=None)
args = parser.parse_args()
rank = int(os.environ.get("RANK", "0"))
if args.pid_dir:
    with open(os.path.join(args.pid_dir, f"rank{rank}"), "w") as handle:
        handle.write(str(os.getpid()))
if args.raise_:
    raise ValueError(f"the script failed on rank {rank}")  # SCRIPT_RAISE_LINE
if args.kill_rank == rank:
    time.sleep(1)
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(120)  # the other ranks: until the launcher stops them
