"""Ranks that the task's own code starts, by running the task process again.

PyTorch Lightning's ``ddp`` strategy starts each other rank as ``sys.executable sys.argv...`` with ``LOCAL_RANK``
set, as torchrun-style re-execs do. Such a copy runs this runtime again, with the task's envelope and result file.
The task process marks itself (:data:`~.protocol.TASK_PID_ENV`) before the user's code runs, so a copy knows it is
one. A copy whose rank (``RANK``, else ``LOCAL_RANK``) is above 0 is a **secondary rank**: it prints no summary,
starts no sampler, and never writes the result, which is rank 0's return value; its own failure goes to the log.
Ranks still running once rank 0's function has returned are waited for a little, then ended, each named in the log
(pid, rank, how it was ended). While the function runs, the first copy to fail (killed by a signal, or a non-zero
exit status) is named the moment it ends (:class:`CopyWatch`), in the log and in the result: the framework then
ends the task process itself (Lightning's observer SIGKILLs it), which could not say why.
A copy's output goes through a splitter, its rank before every line (``output.py``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from .launcher import describe, rank_failure
from .output import say
from .protocol import PREFIX, TASK_PID_ENV

RANK_WAIT_S = 30.0  # how long ranks may go on after rank 0 returned, before SIGTERM (a ddp rank takes seconds)
TERM_GRACE_S = 5.0  # between SIGTERM and SIGKILL


def framework_rank(environ: dict[str, str] | os._Environ[str] = os.environ) -> int | None:
    """The rank a framework gave this process: ``RANK`` (global), else ``LOCAL_RANK``; ``None`` when neither is set."""
    for name in ("RANK", "LOCAL_RANK"):
        value = environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def mark_task_process() -> None:
    """Mark this process as the task process: every copy the user's code starts inherits the mark."""
    os.environ[TASK_PID_ENV] = str(os.getpid())


def is_secondary() -> bool:
    """Whether this process is a copy of the task process, started by the task's code as a rank above 0."""
    marker = os.environ.get(TASK_PID_ENV)
    return bool(marker) and marker != str(os.getpid()) and (framework_rank() or 0) > 0


def announce_secondary() -> None:
    """The one line a secondary rank prints instead of the summary."""
    given = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
    names = " ".join(f"{name}={os.environ[name]}" for name in given if name in os.environ)
    say(
        f"{PREFIX} rank {framework_rank()} (pid {os.getpid()}): a copy of the task process started by the task's "
        f"code ({names}); rank 0 reports the result"
    )


def _descendants(root: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                parents.setdefault(int(handle.read().rpartition(")")[2].split()[1]), []).append(int(entry))
        except (OSError, IndexError, ValueError):
            continue  # it ended meanwhile
    found, todo = [], list(parents.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(parents.get(pid, []))
    return found


def _running(pid: int) -> bool:
    """Whether ``pid`` runs; a child of this process that ended is reaped (a zombie does not run)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass  # not this process's child: another one reaps it
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return handle.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _copy_rank(pid: int, mark: str, argv: list[str]) -> str | None:
    """The rank of ``pid`` when it is a copy of this task process (exec'd with its mark and its arguments)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            environ = dict(
                item.decode(errors="replace").partition("=")[::2] for item in handle.read().split(b"\0") if item
            )
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = [part.decode(errors="replace") for part in handle.read().split(b"\0") if part]
    except OSError:
        return None
    if environ.get(TASK_PID_ENV) != mark or cmdline[-len(argv) :] != argv:
        return None  # a forked helper (a data loader's worker) or another program, not a rank
    rank = framework_rank(environ)
    return "?" if rank is None else str(rank)


def _has_children() -> bool:
    """Whether this process has a child, ended or not (none is reaped)."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def running_copies() -> dict[int, tuple[str, int]]:
    """The copies of this task process still running: pid -> (rank, pidfd); each signal goes through the pidfd."""
    mark, argv = str(os.getpid()), sys.argv[1:]
    copies: dict[int, tuple[str, int]] = {}
    if not _has_children():  # no descendant either: nothing to read in /proc
        return copies
    for pid in _descendants(os.getpid()):
        try:
            pidfd = os.pidfd_open(pid)  # before the check: what is checked is what is signalled
        except OSError:
            continue  # it ended meanwhile
        rank = _copy_rank(pid, mark, argv)
        if rank is not None and _running(pid):
            copies[pid] = (rank, pidfd)
        else:
            os.close(pidfd)
    return copies


def _wait(copies: dict[int, tuple[str, int]], seconds: float) -> dict[int, tuple[str, int]]:
    """The copies still running after up to ``seconds``; each is reaped the moment it ends (its pidfd wakes us).

    At once: a framework that watches its ranks (Lightning's observer polls them) must not see one we ended as
    failed, or it kills this process too.
    """
    import select

    end = time.monotonic() + seconds
    while True:
        for pid in [pid for pid in copies if not _running(pid)]:
            os.close(copies.pop(pid)[1])
        left = end - time.monotonic()
        if not copies or left <= 0:
            return copies
        poller = select.poll()
        for _, pidfd in copies.values():
            poller.register(pidfd, select.POLLIN)  # readable once the process has ended
        poller.poll(min(left, 1.0) * 1000)


def end_leftover_ranks(wait_s: float = RANK_WAIT_S, grace_s: float = TERM_GRACE_S) -> list[str]:
    """End the ranks still running now that rank 0's function has returned; name each in the log.

    They get ``wait_s`` to end by themselves (a rank finishing its own return), then SIGTERM, then SIGKILL after
    ``grace_s``. :return: the log lines written
    """
    lines: list[str] = []
    copies = _wait(running_copies(), wait_s)
    for sig, grace in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 1.0)):
        for pid, (rank, pidfd) in copies.items():
            if sig == signal.SIGTERM:
                why = f"was still running {wait_s:g}s after rank 0's function returned"
            else:
                why = f"did not end within {grace_s:g}s of SIGTERM"
            try:
                signal.pidfd_send_signal(pidfd, sig)
            except ProcessLookupError:
                continue
            lines.append(f"{PREFIX} rank {rank} (pid {pid}) {why}: killed with {signal.Signals(sig).name}")
            say(lines[-1], stderr=True)
        copies = _wait(copies, grace)
    for _, pidfd in copies.values():
        os.close(pidfd)
    return lines


def _children() -> list[int]:
    """The children of this process (every thread's), without a look at the whole process table where Linux can."""
    found: list[int] = []
    for thread in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{thread}/children", encoding="ascii") as handle:
                found.extend(map(int, handle.read().split()))
        except FileNotFoundError:
            return _descendants(os.getpid())  # a kernel without the children files
        except OSError:
            continue  # the thread ended meanwhile
    return found


class CopyWatch(threading.Thread):
    """Names the first copy of the task process to fail, the moment it ends, while the function runs.

    Each copy is watched through a pidfd (readable once it has ended) and looked at without reaping it
    (``WNOWAIT``): its launcher (Lightning's observer) still sees it end. A copy ended by SIGTERM or SIGINT was
    stopped with the task, not its cause. :meth:`stop` looks at every copy once more: a function that failed
    because a copy ended names it, though this thread had no time to.

    :param failed: called with the failure (``launcher.rank_failure``) before the log line
    """

    def __init__(self, failed: Callable[[dict[str, Any]], None], interval_s: float = 0.2) -> None:
        super().__init__(name="airflow-gpu-copy-watch", daemon=True)
        self.failed, self.interval_s = failed, interval_s
        self.failure: dict[str, Any] | None = None
        self.lock = threading.Lock()  # the copies, the failure; stop() takes it too
        self._copies: dict[int, tuple[int, int]] = {}  # pidfd -> (pid, rank)
        self._stopped = threading.Event()

    def run(self) -> None:
        """Look for new copies every ``interval_s``; wake the moment one ends, until :meth:`stop`."""
        import select

        mark, argv, poller = str(os.getpid()), sys.argv[1:], select.poll()
        while not self._stopped.is_set():
            with self.lock:
                known = {pid for pid, _ in self._copies.values()}
                for child in _children():
                    found = None if child in known else _copy_rank(child, mark, argv)
                    if found is None or not found.isdigit():
                        continue  # not a copy, or one still being started: looked at again next time
                    try:
                        pidfd = os.pidfd_open(child)  # a child's pid is not reused before it is reaped
                    except OSError:
                        continue  # it ended and was reaped meanwhile
                    self._copies[pidfd] = (child, int(found))
                    poller.register(pidfd, select.POLLIN)  # readable once the process has ended
            ready = poller.poll(self.interval_s * 1000)
            with self.lock:
                for pidfd, _ in ready:
                    poller.unregister(pidfd)
                    self._look(pidfd)
        with self.lock:
            for pidfd in self._copies:
                os.close(pidfd)
            self._copies.clear()

    def _look(self, pidfd: int) -> None:
        """Name the copy of ``pidfd`` when it ended and failed, and it is the first (the lock is held)."""
        pid, rank = self._copies.pop(pidfd, (0, 0))
        if not pid:
            return  # stop() looked at it already
        os.close(pidfd)
        try:  # not reaped: its launcher still sees it end
            ended = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return  # its launcher reaped it first
        status = None if ended is None else ended.si_status if ended.si_code == os.CLD_EXITED else -ended.si_status
        if self.failure is None and status and -status not in (signal.SIGTERM, signal.SIGINT):
            self.failure = rank_failure(rank, pid, status)
            self.failed(self.failure)
            say(f"{PREFIX} {describe(self.failure)}, the first rank to fail", stderr=True)

    def stop(self, wait_s: float = 0.0) -> dict[str, Any] | None:
        """Stop watching (the function has returned); the failure named, if any.

        :param wait_s: how long a copy may take to end: a function fails the moment a killed copy's connections
            close, before the copy has ended
        """
        import select

        with self.lock:
            self._stopped.set()
            if wait_s > 0 and self._copies:
                poller = select.poll()
                for pidfd in self._copies:
                    poller.register(pidfd, select.POLLIN)
                poller.poll(wait_s * 1000)  # one has ended, or none within wait_s
            for pidfd in list(self._copies):
                self._look(pidfd)
        return self.failure
