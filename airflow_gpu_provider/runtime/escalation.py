"""What a failure is: a GPU out-of-memory error, the host's, an NCCL failure, or another; a failed result's error.

The runtime half of OOM escalation: the kind decided here travels in the result envelope (``error.kind``), and the
worker raises the matching exception and picks the next try's resources from it.
"""

from __future__ import annotations

import os
import time
from typing import Any

from .failures import collective_evidence
from .output import say
from .protocol import ERROR, GPU_OOM, HOST_OOM, INFRASTRUCTURE, PREFIX

# What accelerator libraries raise when the device's memory runs out: torch's OutOfMemoryError (torch.cuda's too),
# or the error text of CUDA, ROCm/HIP, XPU, cuBLAS and XLA. Python's own MemoryError is the host's memory, not this.
GPU_OOM_TYPES = ("OutOfMemoryError",)
GPU_OOM_TEXTS = (
    "CUDA out of memory",
    "CUDA error: out of memory",
    "HIP out of memory",
    "XPU out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "RESOURCE_EXHAUSTED: Out of memory",
)


def _in_chain(exc: BaseException | None, kind: type[BaseException]) -> bool:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, kind):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def is_gpu_oom(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an exception it was raised from, says the GPU's memory ran out."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc).__name__ in GPU_OOM_TYPES or any(text in str(exc) for text in GPU_OOM_TEXTS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def error_record(exc: BaseException) -> dict[str, Any]:
    """The ``error`` of a failed result: type, kind, message, traceback, and when (of several ranks, the earliest)."""
    import traceback

    nccl = collective_evidence(exc)
    kind = (
        GPU_OOM if is_gpu_oom(exc) else HOST_OOM if _in_chain(exc, MemoryError) else INFRASTRUCTURE if nccl else ERROR
    )
    record = {
        "time": time.time(),  # the earliest error of several ranks is the root cause
        "type": type(exc).__name__,
        "kind": kind,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }
    if kind == INFRASTRUCTURE:
        record["evidence"] = nccl  # the line that says NCCL failed (failures.py)
    return record


def failed(exc: BaseException) -> dict[str, Any]:
    """The result of a function that raised ``exc``, and one line to the log.

    The traceback travels in the result: the worker logs it once, at ERROR (a rank's that is not the launch's
    cause is only named here). It starts at the user's code, not at the runtime's call of it.
    """
    if exc.__traceback__ is not None and exc.__traceback__.tb_next is not None:
        exc = exc.with_traceback(exc.__traceback__.tb_next)  # the runtime's own frame (call_function) left out
    error = error_record(exc)
    rank = f"rank {os.environ['RANK']}: " if "RANK" in os.environ else ""
    first_line = (error["message"].splitlines() or [""])[0][:500]
    say(f"{PREFIX} {rank}the task raised {error['type']}: {first_line}", stderr=True)
    if error["kind"] in (GPU_OOM, HOST_OOM):
        what = "GPU" if error["kind"] == GPU_OOM else "host"
        say(f"{PREFIX} {rank}the task ran out of {what} memory ({error['type']})", stderr=True)
    return {"ok": False, "error": error}
