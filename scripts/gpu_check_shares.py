"""``make gpu-check``'s share rows: two shares of one real GPU at once, each held to its share, and their throughput.

- ``shares``: two local-backend tasks of ``gpu_count=0.5`` run at the same time on one GPU. Each allocates less than
  its share (it must succeed) and more (it must fail with a CUDA out-of-memory error: the share is enforced), by
  MPS where the host has it (the provider starts its daemon for the GPU when ``nvidia-cuda-mps-control`` is
  installed), else by PyTorch's cap. The row says which, from the backend's log.
- ``share-throughput``: the same two tasks' small workload (1024x1024 matmuls, a GPU far from saturated), as two
  shares at once and as two whole-GPU tasks one after the other: the makespans and their ratio. Shares that made
  the pair slower than running it in turn (beyond :data:`SLOWER`) fail the row.

The verdicts are pure functions of what the tasks report (``tests/test_gpu_check.py`` checks them without a GPU).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

SHARE = 0.5  # two tasks, each half of the GPU
MARGIN = 0.15  # of the GPU: what each task allocates below and above its share
WORK = 3000  # matmuls per task
SLOWER = 1.25  # the shared pair may take at most this much longer than the same tasks one after the other


class ShareCheckError(Exception):
    """A share row found sharing broken; the message says how."""


# ---------------------------------------------------------------------------------- what runs in the tasks
def probe_share(share: float, margin: float, work: int) -> dict:
    """In a task of ``share`` of a GPU (or a whole one): allocate below and above it, then time a small workload."""
    import os
    import time

    import torch

    total = torch.cuda.get_device_properties(0).total_memory
    report: dict = {"gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "total": total}
    report["mps_limit"] = os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
    if share < 1:
        below = torch.empty(int(total * (share - margin)), dtype=torch.uint8, device="cuda")
        del below
        torch.cuda.empty_cache()
        try:
            above = torch.empty(int(total * (share + margin)), dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError as err:
            report["above"] = f"refused: {str(err).splitlines()[0][:200]}"
        else:
            report["above"] = "allocated"
            del above
        torch.cuda.empty_cache()
    matrix = torch.randn(1024, 1024, device="cuda")
    torch.cuda.synchronize()
    started = time.monotonic()
    for _ in range(work):
        matrix = torch.tanh(matrix @ matrix)
    torch.cuda.synchronize()
    report["seconds"] = time.monotonic() - started
    return report


# ------------------------------------------------------------------------------------------------ the rows
def two_at_once(run: Callable[[float], dict]) -> tuple[list[dict], float]:
    """Run two tasks of :data:`SHARE` at once; their reports and the pair's makespan."""
    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        reports = list(pool.map(run, [SHARE, SHARE]))
    return reports, time.monotonic() - started


def one_after_the_other(run: Callable[[float], dict]) -> tuple[list[dict], float]:
    """Run the same two tasks on a whole GPU each, in turn; their reports and the makespan."""
    started = time.monotonic()
    reports = [run(1.0), run(1.0)]
    return reports, time.monotonic() - started


def enforcement(lines: Sequence[str]) -> str:
    """How the backend said the shares were enforced (its ``[gpu] a share of ...`` lines)."""
    said = {line.split("enforced by ", 1)[1].split(" (")[0].split(":")[0] for line in lines if "enforced by " in line}
    if not said:
        raise ShareCheckError(f"the backend's log does not say how the shares were enforced: {list(lines)[-3:]}")
    return ", ".join(sorted(said))


def verdict_shares(reports: Sequence[dict[str, Any]], lines: Sequence[str]) -> str:
    """The ``shares`` row: one GPU, each share held to its size, and how."""
    gpus = {report.get("gpu") for report in reports}
    if len(reports) != 2 or len(gpus) != 1:
        raise ShareCheckError(f"two shares of {SHARE} should share one GPU, they ran on {sorted(map(str, gpus))}")
    loose = [report for report in reports if not str(report.get("above", "")).startswith("refused")]
    how = enforcement(lines)
    if loose:
        raise ShareCheckError(
            f"a task allocated {SHARE + MARGIN:.0%} of the GPU while its share was {SHARE:.0%} (enforced by {how}): "
            f"{loose[0]}"
        )
    limit = reports[0].get("mps_limit")
    return (
        f"2 shares of {SHARE:.0%} at once on {gpus.pop()}; {SHARE + MARGIN:.0%} of the GPU refused to each "
        f"(CUDA out of memory), {SHARE - MARGIN:.0%} allocated; enforced by {how}"
        + (f" (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={limit})" if limit else "")
    )


def verdict_throughput(shared: float, in_turn: float, how: str) -> str:
    """The ``share-throughput`` row: the shared pair's makespan against the same tasks one after the other."""
    ratio = shared / in_turn
    detail = (
        f"{WORK} matmuls 1024x1024 x 2 tasks: {shared:.2f} s as two shares at once ({how}) vs {in_turn:.2f} s one "
        f"after the other on the whole GPU: {ratio:.2f}x the time ({in_turn / shared:.2f}x the throughput)"
    )
    if ratio > SLOWER:
        raise ShareCheckError(f"sharing made the pair slower than running it in turn: {detail}")
    return detail
