"""The subreaper of a Ray task's processes on its node: what the job's entrypoint (and each rank) runs first.

Shipped in the job's ``working_dir`` and run there with the node's Python (standard library only):
``python airflow_gpu_ray_reaper.py runtime.pyz ENVELOPE RESULT``. It makes itself a child subreaper
(``prctl(PR_SET_CHILD_SUBREAPER)``) and runs the runtime beneath it, so whatever the task starts and leaves behind
(a background child, a ``setsid`` grandchild, a process that ignores SIGTERM) is re-parented to it, never to init.
When the runtime ends, or Ray stops the job (SIGTERM to the entrypoint's process group), every process left beneath
it gets SIGTERM, then SIGKILL after the grace (``AIRFLOW_GPU_KILL_GRACE``, 2 s): a job leaves no process on its node,
as a container leaves none on its host. Its exit status is the runtime's.

First it checks that the node reaches the task's checkpoint folder where the worker made it
(``AIRFLOW_GPU_CHECKPOINT_ON_WORKER``, set by ``job.submit``): a node that lacks it does not share the worker's file
system at that path, and the job fails at once, saying so, rather than checkpoint to a disk of its own that the next
try, on another node, would never see.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
ON_WORKER = "AIRFLOW_GPU_CHECKPOINT_ON_WORKER"  # the checkpoint folder the worker made: every node must see it


def unreached_checkpoint() -> str | None:
    """Why this node cannot run the task: the checkpoint folder the worker made is not here; else ``None``."""
    folder = os.environ.get(ON_WORKER, "")
    if not folder or os.path.isdir(folder):
        return None
    return (
        f"[gpu] error: the task's checkpoint folder {folder}, made by the Airflow worker, is not on this Ray node: "
        "the checkpoint root is not a file system that every node mounts at the same path. Mount it on every node "
        "at that path, or make checkpoint= (or [gpu] checkpoint_root) an object-storage URI (docs/ray.md)."
    )


def _descendants() -> list[int]:
    """The processes beneath this one (a /proc walk: parents by ``stat``)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry))
    found, todo = [], [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _reap() -> None:
    """Collect the zombies of the processes re-parented here."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def stop_all(grace: float) -> None:
    """SIGTERM to every process beneath this one, SIGKILL to those left after ``grace`` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        left = _descendants()
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            _reap()
            left = _descendants()
        if not left:
            return


def main(argv: list[str]) -> int:
    """Run the runtime beneath this subreaper; stop what it left; exit with its status."""
    refused = unreached_checkpoint()
    if refused is not None:
        print(refused, file=sys.stderr, flush=True)
        return 2
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)
    grace = float(os.environ.get("AIRFLOW_GPU_KILL_GRACE", "2"))
    child = subprocess.Popen([sys.executable, *argv])

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(OSError):
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    status = child.wait()
    stop_all(grace)
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
