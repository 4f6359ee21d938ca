"""Ranks that the task's own code starts, by running the task process again.

PyTorch Lightning's ``ddp`` strategy starts each other rank as ``sys.executable sys.argv...`` with ``LOCAL_RANK``
set, as torchrun-style re-execs do. Such a copy runs this runtime again, with the task's envelope and result file.
The task process marks itself (:data:`~.protocol.TASK_PID_ENV`) before the user's code runs, so a copy knows it is
one. A copy whose rank (``RANK``, else ``LOCAL_RANK``) is above 0 is a **secondary rank**: it prints no summary,
starts no sampler, and never writes the result, which is rank 0's return value; its own failure goes to the log.
Ranks still running once rank 0's function has returned are waited for a little, then ended, each named in the log
(pid, rank, how it was ended).
"""

from __future__ import annotations

import os
import signal
import sys
import time

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
    print(
        f"{PREFIX} rank {framework_rank()} (pid {os.getpid()}): a copy of the task process started by the task's "
        f"code ({names}); rank 0 reports the result",
        flush=True,
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
            print(lines[-1], file=sys.stderr, flush=True)
        copies = _wait(copies, grace)
    for _, pidfd in copies.values():
        os.close(pidfd)
    return lines
