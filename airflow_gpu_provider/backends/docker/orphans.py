"""Containers whose worker died: found by a label naming the worker process, removed before new work starts.

A worker killed with SIGKILL cannot remove its container, and its GPU locks are freed with it while the container
may still be using the GPUs. Every container is labelled with its worker (host, pid and the pid's start time, so a
reused pid is not mistaken for it); before a task takes GPUs on this host, the containers of dead workers of this
host are removed. Containers of workers on other hosts (sharing a remote engine) are left to them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from pathlib import Path
from typing import Any

from docker.errors import APIError, NotFound

WORKER_LABEL = "airflow-gpu-provider.worker"


def _started(pid: int) -> str | None:
    """The start time of a process (clock ticks after boot), or ``None`` when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def worker_identity() -> str:
    """The worker process, as the label names it: ``host:pid:start``."""
    return f"{socket.gethostname()}:{os.getpid()}:{_started(os.getpid())}"


def _dead(identity: str) -> bool:
    parts = identity.split(":")
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False  # another host's worker, or not a label this provider wrote
    return _started(int(parts[1])) != parts[2]


def reap_orphans(client: Any, log: logging.Logger) -> list[str]:
    """Remove the containers of this host's dead workers; return their ids."""
    reaped = []
    for container in client.containers(all=True, filters={"label": WORKER_LABEL}):
        if _dead(container["Labels"].get(WORKER_LABEL, "")):
            with contextlib.suppress(NotFound, APIError):
                client.remove_container(container["Id"], force=True)
                reaped.append(container["Id"])
                log.warning(
                    "Removed container %s, left running by a worker that died (%s)",
                    container["Id"][:12],
                    container["Labels"][WORKER_LABEL],
                )
    return reaped
