"""The local task's process tree: started under a supervisor, its output streamed, stopped as a whole.

The worker starts the task process through its supervisor (:mod:`.supervisor`): a child subreaper, so everything the
task starts stays beneath it whatever it does (``setpgid``, ``setsid``, ``env -i``, a double fork), and it stops all
of it when the task process ends, when the worker asks (on_kill) or when the worker dies, holding the GPU locks
until nothing of the task is left (rule T1, docs/security.md: a task's processes are found whatever they do). The
worker waits for the task process, not for the end of its output: a background child that keeps the pipe open
cannot hang the task.

Every process the task starts also inherits a token in its environment (``AIRFLOW_GPU_TASK``), starting with the
worker's identity: what escaped a supervisor that was itself killed, and kept its environment, is still found in
``/proc``, by the worker or, when the worker was killed too, by the next local task on the host
(:func:`reap_orphans`). Every signal goes through a pidfd: a pid that another process reuses is never signalled.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from airflow_gpu_provider.backends.local.supervisor import KILL_WAIT, MODULE, SCRIPT, STOP_NOW
from airflow_gpu_provider.host.state import compiled_script
from airflow_gpu_provider.host.workers import is_dead, worker_identity
from airflow_gpu_provider.runtime.reaper import Pinned
from airflow_gpu_provider.task.output import log_output

TOKEN_VARIABLE = "AIRFLOW_GPU_TASK"  # noqa: S105 - the name of a variable, not a secret
_PREFIX = f"\0{TOKEN_VARIABLE}=".encode()  # a variable of its own, not the end of another
COMPILED = re.compile(r"supervisor-[0-9a-f]{16}-[\w.-]+\.pyc")  # the supervisor compiled into the state dir


def _token(pid: int | str) -> str | None:
    """The task token in a process's environment (one this user may read), or ``None``."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            environ = b"\0" + handle.read()  # every process of the host is read: the fewest steps per process
    except OSError:
        return None
    start = environ.find(_PREFIX)
    if start < 0:
        return None
    start += len(_PREFIX)
    end = environ.find(b"\0", start)
    return environ[start : None if end < 0 else end].decode(errors="replace")


def _tokens() -> dict[int, str]:
    """``{pid: token}`` of every process of this host that carries a token (and this user may read)."""
    return {int(name): token for name in os.listdir("/proc") if name.isdigit() and (token := _token(name))}


def tree(token: str) -> list[int]:
    """Every running process of this host (this user may see) that carries ``token``."""
    return [pid for pid, found in _tokens().items() if found == token and _running(pid)]


def _running(pid: int) -> bool:
    """Whether a process runs (a zombie, which holds no descriptor, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _signal(tokens: Mapping[int, str], sig: int) -> None:
    """Signal each pid (pinned first), when, once pinned, it still carries the token it was found with."""
    for pid, token in tokens.items():
        try:
            process = Pinned(pid)
        except ProcessLookupError:
            continue
        try:
            if _token(pid) == token:  # read after pinning: the pid is still that process
                process.send(sig)
        except (ProcessLookupError, PermissionError):
            pass
        finally:
            process.close()


def _is_supervisor(pid: int) -> bool:
    """Whether ``pid`` runs the supervisor: its script, or the script compiled into the state dir."""
    with contextlib.suppress(OSError):
        parts = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        return any(part.endswith(MODULE.encode()) or COMPILED.fullmatch(Path(os.fsdecode(part)).name) for part in parts)
    return False


def reap_orphans(log: logging.Logger, grace: float = 5.0) -> list[int]:
    """Stop the task processes that dead workers of this host left running; return their pids.

    Their supervisors stop them by themselves when the worker dies, after the task's grace period: this cuts it short
    (SIGUSR1 after ``grace``), and stops what carries the token without a supervisor. When this returns, the GPU locks
    they held are free, unless a process of theirs outlived SIGKILL.
    """
    tokens = {pid: token for pid, token in _tokens().items() if is_dead(token.rsplit("/", 1)[0])}
    if not tokens:
        return []
    orphans = sorted(tokens)
    log.warning("Stopping processes %s, left running by a worker that died", orphans)
    _signal(tokens, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(_running(pid) for pid in orphans) and time.monotonic() < deadline:
        time.sleep(0.05)
    supervisors = [pid for pid in orphans if _is_supervisor(pid)]
    _signal({pid: tokens[pid] for pid in supervisors}, STOP_NOW)
    _signal({pid: token for pid, token in tokens.items() if pid not in supervisors}, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT
    while any(_running(pid) for pid in orphans) and time.monotonic() < deadline:
        time.sleep(0.05)
    return orphans


class TaskProcess:
    """One task process and everything it starts, beneath its supervisor.

    :param pass_fds: descriptors the supervisor and the task process inherit (the GPU locks: held while they live)
    :param kill_grace: seconds between SIGTERM and SIGKILL
    :param state_dir: where the supervisor's compiled script is kept (``host/state.py`` ``compiled_script``)
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
        state_dir: str = "",
    ) -> None:
        self.token = f"{worker_identity()}/{uuid.uuid4().hex}"
        self.kill_grace = kill_grace
        self.log = log
        status_read, status_write = os.pipe()
        script = str(compiled_script(state_dir, SCRIPT)) if state_dir else SCRIPT  # compiled once per host
        supervisor = [sys.executable, "-I", "-S", script, "--grace", str(kill_grace), "--worker", worker_identity()]
        try:
            self.process = subprocess.Popen(
                [*supervisor, "--status", str(status_write), "--", *argv],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env={**environment, TOKEN_VARIABLE: self.token},
                cwd=cwd,
                start_new_session=True,  # a signal to the worker's group is not one to the task
                pass_fds=(*pass_fds, status_write),
            )
        finally:
            os.close(status_write)
        self._supervisor = Pinned(self.process.pid)  # our child, not reaped before we wait for it
        self._status = os.fdopen(status_read, "rb")
        self._exit: int | None = None
        assert self.process.stdout is not None
        pipe = self.process.stdout.fileno()
        self._reader = threading.Thread(target=log_output, args=(lambda: os.read(pipe, 65536), log), daemon=True)
        self._reader.start()

    def _next_status(self) -> tuple[str, str] | None:
        """The supervisor's next status line, or ``None`` once it has exited."""
        line = self._status.readline().decode(errors="replace").strip()
        if not line:
            return None
        kind, _, value = line.partition(" ")
        return kind, value

    def wait(self) -> int:
        """The task process's exit status (its output may still be open in a child: that is not waited for)."""
        while self._exit is None:
            status = self._next_status()
            if status is None:  # the supervisor ended without a word: killed (its task process was killed with it)
                self._exit = self.process.wait()
            elif status[0] == "exit":
                self._exit = int(status[1])
        return self._exit

    def terminate(self) -> None:
        """Stop the whole tree: SIGTERM, SIGKILL after the grace (by the supervisor). Safe inside a signal handler."""
        with contextlib.suppress(ProcessLookupError):
            self._supervisor.send(signal.SIGTERM)

    def stop(self) -> list[int]:
        """Stop what is left of the task and wait for it; return what could not be killed (its GPUs stay locked).

        Also when the task process still runs (``execution_timeout`` raised in :meth:`wait`): it is stopped first.
        """
        if self._exit is None:
            self.terminate()
        while (status := self._next_status()) is not None:
            if status[0] == "exit":
                self._exit = int(status[1])
            elif status[0] == "left":  # in the GPU driver: the supervisor holds the locks until they end
                self._close()
                return [int(pid) for pid in status[1].split(",")]
        # a supervisor that ended by itself (status 0) stopped every process beneath it; one that was killed may have
        # left some, outside its tree now: found by their token
        left = self._stop_escaped() if self.process.wait() != 0 else []
        self._close()
        return left

    def _stop_escaped(self) -> list[int]:
        """What carries the token but outlived its supervisor (killed by the task itself): SIGTERM, then SIGKILL."""
        left = tree(self.token)
        if not left:
            return []
        self.log.warning("Stopping processes %s of the task, which outlived its supervisor", left)
        _signal(dict.fromkeys(left, self.token), signal.SIGTERM)
        deadline = time.monotonic() + self.kill_grace
        while (left := tree(self.token)) and time.monotonic() < deadline:
            time.sleep(0.05)
        _signal(dict.fromkeys(left, self.token), signal.SIGKILL)
        deadline = time.monotonic() + KILL_WAIT
        while (left := tree(self.token)) and time.monotonic() < deadline:
            time.sleep(0.05)
        return left

    def _close(self) -> None:
        self._reader.join(timeout=5)  # nothing holds the pipe any more
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._status.close()
        self._supervisor.close()
