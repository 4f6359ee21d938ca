"""Which worker process started something, and whether that worker is gone.

A worker killed with SIGKILL cannot stop what it started: a task process (local backend) or a container (Docker).
Both are marked with the worker's identity (host, pid and the pid's start time, so that a reused pid is not taken
for it); the next task on the host stops what dead workers of this host left before it takes GPUs.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path


def started_at(pid: int) -> str | None:
    """The start time of a process (clock ticks after boot), or ``None`` when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def worker_identity() -> str:
    """The identity of the calling worker process: ``host:pid:start``."""
    return f"{socket.gethostname()}:{os.getpid()}:{started_at(os.getpid())}"


def is_dead(identity: str) -> bool:
    """Whether ``identity`` names a worker of this host that has exited (never true for another host's)."""
    parts = identity.split(":")
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit() or parts[2] == "None":
        return False  # another host's worker, not an identity this provider wrote, or a host without /proc
    return started_at(int(parts[1])) != parts[2]


def describe_holder(info: dict[str, object]) -> str:
    """Who holds a lock, and for how long: the worker that took it, or what it left running when it is gone."""
    holder, pid, since = info.get("holder", "an unknown task"), info.get("pid", "?"), info.get("since")
    held = f", for {time.time() - since:.0f}s" if isinstance(since, (int, float)) else ""
    if str(pid).isdigit() and not Path(f"/proc/{pid}").exists():
        return f"a process left by {holder} (its worker, pid {pid}, has exited{held})"
    return f"{holder} (pid {pid}{held})"
