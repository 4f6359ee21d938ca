"""Shares of one GPU: what placing one costs (here, on CPU), and what sharing gives (on a GPU machine).

``placement`` (runs anywhere): the host allocator's own time per task, ``acquire`` + ``release``, for a whole GPU
and for a share of one, on 4 listed GPUs (``0=L4,...``: 24 GiB each), with 0, 8 and 24 shares already held by
other processes' descriptors (each placement reads ``/proc/locks`` and the GPU's share files). Interleaved
(whole, share, whole, share, ...), medians in microseconds, with the machine's load.

``throughput`` (needs an NVIDIA GPU; refused without one): 16 small tasks (each ``--work`` 1024x1024 matmuls, far
from filling a GPU) through the local backend on one GPU, as 16 shares of 1/16 at once (MPS where the host has it,
else PyTorch's cap) vs the same 16 tasks on the whole GPU one after the other: makespans and their ratio. Run it on a
lent GPU; docs/benchmarks.md says whether it was.

    python benchmarks/gpu_shares.py placement [--rounds 2000]
    python benchmarks/gpu_shares.py throughput [--tasks 16] [--work 3000]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import REPO

sys.path.insert(0, str(REPO / "scripts"))
LOG = logging.getLogger("bench")


def placement(rounds: int) -> None:
    from airflow_gpu_provider.host.allocator import GpuAllocator
    from airflow_gpu_provider.host.inventory import parse_devices
    from airflow_gpu_provider.settings.shares import GpuShare

    devices = parse_devices("0=L4,1=L4,2=L4,3=L4")
    load = [os.getloadavg()[0]]
    print(
        f"\n## Placement per task: acquire + release on 4 GPUs ({os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')})\n"
    )
    print("| already held | whole GPU µs | share (1/32) µs | share / whole |\n| --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as folder:
        allocator = GpuAllocator(Path(folder) / "locks")
        options = {"policy": "fail", "holder": "bench", "requested": "x", "present": devices, "log": LOG}
        held = []
        for others in (0, 8, 24):
            while len(held) < others:  # shares of the other GPUs' tasks, as other workers hold them
                held.append(allocator.acquire(devices[1:], 1, share=GpuShare(fraction=1 / 32), **options))
            times: dict[str, list[float]] = {"whole": [], "share": []}
            for _ in range(rounds):
                for name, share in (("whole", None), ("share", GpuShare(fraction=1 / 32))):
                    started = time.perf_counter()
                    allocator.acquire(devices, 1, share=share, **options).release()
                    times[name].append(time.perf_counter() - started)
            whole, share = (statistics.median(times[name]) * 1e6 for name in ("whole", "share"))
            print(f"| {others} shares | {whole:.0f} | {share:.0f} | {share / whole:.2f}x |")
            load.append(os.getloadavg()[0])
        for allocation in held:
            allocation.release()
    print(f"\nLoad average {min(load):.1f}–{max(load):.1f}; {rounds} rounds each, medians.")


def throughput(tasks: int, work: int) -> None:
    from gpu_check import _run_local_task, find_gpus  # the local backend, as make gpu-check runs it
    from gpu_check_shares import probe_share

    gpus, why = find_gpus()
    if not gpus:
        sys.exit(f"throughput needs an NVIDIA GPU: none here ({why}). Run it on a GPU machine.")
    os.environ["AIRFLOW__GPU__DEVICES"] = "auto"
    context = type("Context", (), {"log": LOG, "records": []})()
    share = round(1 / tasks, 4)

    def one(fraction: float) -> dict:
        return dict(_run_local_task(context, probe_share, 1.0, 0.0, work, gpus=fraction)[0])  # no memory probe

    started = time.monotonic()
    with ThreadPoolExecutor(tasks) as pool:
        list(pool.map(one, [share] * tasks))
    shared = time.monotonic() - started
    started = time.monotonic()
    for _ in range(tasks):
        one(1.0)
    in_turn = time.monotonic() - started
    print(f"\n## {tasks} tasks of {work} matmuls (1024x1024) on {gpus[0]['name']}, load {os.getloadavg()[0]:.1f}\n")
    print(f"| shares of {share:g} at once | whole GPU, one after the other | shared / in turn |\n| --- | --- | --- |")
    print(f"| {shared:.1f} s | {in_turn:.1f} s | {shared / in_turn:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("placement", "throughput"))
    parser.add_argument("--rounds", type=int, default=2000, help="placements of each kind per row (2000)")
    parser.add_argument("--tasks", type=int, default=16, help="tasks sharing one GPU (16)")
    parser.add_argument("--work", type=int, default=3000, help="matmuls per task (3000)")
    arguments = parser.parse_args()
    if arguments.what == "placement":
        placement(arguments.rounds)
    else:
        throughput(arguments.tasks, arguments.work)


if __name__ == "__main__":
    main()
