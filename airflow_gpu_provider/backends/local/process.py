"""The local task's process tree: started in its own session, its output streamed, stopped as a whole.

Every process the task starts inherits a token in its environment (``AIRFLOW_GPU_TASK``), so the worker finds
them all in ``/proc``, also those that left the process group with ``setsid`` or were orphaned to init. When the task
process ends, whatever it left running is stopped (SIGTERM, then SIGKILL after the grace period); the GPUs are
released only when none of them is left. The worker waits for the task process, not for the end of its output: a
background child that keeps the pipe open cannot hang the task.

The token starts with the worker's identity: what a worker killed with SIGKILL left running (still holding its GPUs)
is stopped by the next local task on the host, :func:`reap_orphans`.
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

from airflow_gpu_provider.host.workers import is_dead, worker_identity
from airflow_gpu_provider.task.output import stream

TOKEN_VARIABLE = "AIRFLOW_GPU_TASK"  # noqa: S105 - the name of a variable, not a secret
_PREFIX = f"{TOKEN_VARIABLE}=".encode()


def _tokens() -> dict[int, str]:
    """``{pid: token}`` of every process of this host that carries a token (and this user may read)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for variable in (entry / "environ").read_bytes().split(b"\0"):
                if variable.startswith(_PREFIX):
                    found[int(entry.name)] = variable[len(_PREFIX) :].decode(errors="replace")
                    break
    return found


def tree(token: str) -> list[int]:
    """Every process of this host (this user may see) that carries ``token``."""
    return [pid for pid, found in _tokens().items() if found == token]


def reap_orphans(log: logging.Logger, grace: float = 5.0) -> list[int]:
    """Stop the task processes that dead workers of this host left running; return their pids.

    They still hold the GPU locks they inherited; when this returns, those locks are free.
    """
    orphans = [pid for pid, token in _tokens().items() if is_dead(token.rsplit("/", 1)[0])]
    if not orphans:
        return []
    log.warning("Stopping processes %s, left running by a worker that died", orphans)
    _signal(orphans, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(_running(pid) for pid in orphans) and time.monotonic() < deadline:
        time.sleep(0.05)
    _signal(orphans, signal.SIGKILL)
    deadline = time.monotonic() + 30  # SIGKILL is not instant for a process in the GPU driver
    while any(_running(pid) for pid in orphans) and time.monotonic() < deadline:
        time.sleep(0.05)
    return orphans


def _running(pid: int) -> bool:
    """Whether a process runs (a zombie, which holds no descriptor, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


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
        self.token = f"{worker_identity()}/{uuid.uuid4().hex}"
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
