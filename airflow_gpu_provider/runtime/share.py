"""A share of one GPU inside the task: the line that says how it is enforced, and PyTorch's cap where that is it.

The worker decides the enforcement (``host/mps.py``) and sends it as the summary's ``share``. With ``framework``, the
task's function runs with PyTorch's CUDA caching allocator capped at the share
(``torch.cuda.set_per_process_memory_fraction`` on device 0, the one GPU the task sees; a memory share without a
fraction, as on Slurm, is taken of that GPU's total), set here before the
function is loaded; PyTorch is imported only for such a task. Without PyTorch or CUDA there, nothing enforces the
share: the try fails unless the admin allows unenforced shares. A copy of the task process that the task's code
starts (a framework's own spawn: Lightning's ddp) is refused on a share: each copy would take the share again.
"""

from __future__ import annotations

from typing import Any

from .output import say
from .protocol import PREFIX


class ShareNotEnforced(RuntimeError):
    """Nothing can enforce the task's share of a GPU here, and the admin does not allow that."""


def enforce_share(share: dict[str, Any] | None) -> ShareNotEnforced | None:
    """Announce the share (``None``: the task has none) and set PyTorch's cap where that enforces it.

    :return: the error that ends the try, or ``None``
    """
    if not share:
        return None
    say(f"{PREFIX} GPU share: {share.get('line')}")
    if share.get("enforcement") != "framework":
        return None
    fraction = float(share.get("fraction") or 0.0)
    try:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        if not fraction:  # a memory share whose GPU the worker did not know (Slurm places it): of this one's total
            fraction = min(1.0, int(share.get("memory") or 0) / torch.cuda.get_device_properties(0).total_memory)
        torch.cuda.set_per_process_memory_fraction(fraction, 0)
    except Exception as exc:  # noqa: BLE001 - no PyTorch, no CUDA, a cap it refuses: the share is not enforced
        why = f"PyTorch's cap could not be set ({type(exc).__name__}: {exc})"
        if share.get("unenforced_allowed"):
            say(f"{PREFIX} GPU share NOT enforced: {why}; [gpu_policy] allow_unenforced_gpu_shares allows it")
            return None
        return ShareNotEnforced(
            f"the task's share of a GPU cannot be enforced: {why}, and the host has no MPS for it. Install PyTorch "
            "in the task's environment, run MPS on the host, give the task a whole GPU (gpu_count=1), or ask the "
            "admin for [gpu_policy] allow_unenforced_gpu_shares."
        )
    say(f"{PREFIX} GPU share: PyTorch's CUDA allocator capped at {fraction:.1%} of the GPU")
    return None


def refuse_copy(share: dict[str, Any] | None) -> bool:
    """Whether a copy of the task process (the task's code started it again) must end: the task has a share."""
    if not share:
        return False
    say(
        f"{PREFIX} this task has a share of one GPU, which one process uses: a copy of the task process (a "
        "framework's own launch, such as Lightning's ddp) is refused. Multi-process launches take whole GPUs "
        "(gpu_count=1 or more).",
        stderr=True,
    )
    return True
