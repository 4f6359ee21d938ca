"""The local task's process tree: started in its own session, its output streamed, stopped as a whole.

Every process the task starts inherits a token in its environment (``AIRFLOW_GPU_TASK``), so the worker finds
them all in ``/proc``, also those that left the process group with ``setsid`` or were orphaned to init. When the task
process ends, whatever it left running is stopped (SIGTERM, then SIGKILL after the grace period); the GPUs are
released only when none of them is left. The worker waits for the task process, not for the end of its output: a
background child that keeps the pipe open cannot hang the task.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from airflow_gpu_provider.task.output import stream

TOKEN_VARIABLE = "AIRFLOW_GPU_TASK"  # noqa: S105 - the name of a variable, not a secret


def tree(token: str) -> list[int]:
    """Every process of this host (this user may see) that carries ``token``."""
    marker = f"{TOKEN_VARIABLE}={token}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


def _signal(pids: Sequence[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


class TaskProcess:
    """One task process and everything it starts.

    :param pass_fds: descriptors the task process inherits (the GPU locks: held while it lives)
    :param kill_grace: seconds between SIGTERM and SIGKILL
    """

    def __init__(
        self,
        argv: Sequence[str],
        environment: Mapping[str, str],
        *,
        cwd: str,
        pass_fds: Sequence[int],
        log: logging.Logger,
        kill_grace: float,
    ) -> None:
        self.token = uuid.uuid4().hex
        self.kill_grace = kill_grace
        self.process = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**environment, TOKEN_VARIABLE: self.token},
            cwd=cwd,
            start_new_session=True,
            pass_fds=tuple(pass_fds),
        )
        assert self.process.stdout is not None
        pipe = self.process.stdout.fileno()
        self._reader = threading.Thread(
            target=stream, args=(lambda: os.read(pipe, 65536), lambda line: log.info("%s", line)), daemon=True
        )
        self._reader.start()

    def wait(self) -> int:
        """The task process's exit status (its output may still be open in a child: that is not waited for)."""
        return self.process.wait()

    def signal(self, sig: signal.Signals) -> None:
        """Signal the whole tree. Safe inside a signal handler: it neither waits nor touches the output."""
        _signal([self.process.pid, *tree(self.token)], sig)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    def stop(self) -> list[int]:
        """Stop the whole tree (SIGTERM, then SIGKILL after the grace period); return what could not be killed."""
        if self.process.poll() is None or tree(self.token):
            self.signal(signal.SIGTERM)
            deadline = time.monotonic() + self.kill_grace
            while (self.process.poll() is None or tree(self.token)) and time.monotonic() < deadline:
                time.sleep(0.05)
        self.signal(signal.SIGKILL)
        self.process.wait()
        deadline = time.monotonic() + 30  # SIGKILL is not instant for a process in the GPU driver
        while (left := tree(self.token)) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._reader.join(timeout=5)  # nothing holds the pipe any more
        if self.process.stdout is not None:
            self.process.stdout.close()
        return left
