"""Keep a task's GPU locks for as long as a process the worker does not own runs: a container's.

The locks are ``flock`` s on descriptors that die with the worker. A container outlives a worker killed with SIGKILL,
and would go on using GPUs that the next task could be given. So the Docker backend hands the lock descriptors to a
keeper, ``python -m airflow_gpu_provider.host.keeper PID START``, in a session of its own: it waits for the
container's main process (``PID``, started at ``START``) to end, and only then do the locks go. The worker stops it
when it removes the container; a container left by a dead worker is reaped by the next Docker task, and its keeper
ends with it.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from airflow_gpu_provider.host.workers import started_at


def keep(pid: int, start: str) -> None:
    """Return when process ``pid`` (started at ``start``) has ended."""
    with contextlib.suppress(OSError, AttributeError):
        handle = os.pidfd_open(pid)  # Linux >= 5.3: readable once the process exits, no polling
        try:
            if started_at(pid) == start:
                select.select([handle], [], [])
            return
        finally:
            os.close(handle)
    while started_at(pid) == start:
        time.sleep(0.2)


class Keeper:
    """A keeper process holding ``fds`` while process ``pid`` runs (``container_id``: its container, if any).

    :raises ValueError: when ``pid`` is not a process of this host (of that container)
    """

    def __init__(self, pid: int, fds: Sequence[int], *, container_id: str | None = None) -> None:
        start = started_at(pid)
        cgroup = Path(f"/proc/{pid}/cgroup")
        if start is None or (container_id and container_id not in cgroup.read_text(errors="replace")):
            raise ValueError(f"process {pid} is not {'container ' + container_id[:12] if container_id else 'here'}")
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__, str(pid), start],
            pass_fds=tuple(fds),
            start_new_session=True,  # a kill of the worker's process group leaves it
            stdin=subprocess.DEVNULL,  # none of the worker's streams: a pipe it holds would outlive the worker
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        """Stop keeping (the process is gone, or the worker releases the locks itself)."""
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGKILL)
        self.process.wait()


if __name__ == "__main__":
    keep(int(sys.argv[1]), sys.argv[2])
