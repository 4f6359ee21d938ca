"""The pinned subreaper: what a task leaves running is found, whatever it did, and stopped without a pid guess.

A process that makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``, :func:`become_subreaper`) gets
every orphan beneath it re-parented to it, never to init, whatever the orphan did to its process group, session or
environment (``setsid``, ``env -i``, a double fork): its descendants are exactly what a walk of ``/proc`` from it
finds. :func:`signal_descendants` signals each through a pidfd, after it was pinned and found still to be a child of
a pinned descendant (or of the subreaper): a pid that another process reuses is never signalled.

Two users, one code: the local backend's supervisor (``backends/local/supervisor.py``, which loads this file by its
path: it imports nothing of the provider) and a job's entrypoint on its node (``python3 runtime.pyz reap ENVELOPE
RESULT``, :func:`reap_main`: a Slurm job), which runs the runtime beneath itself, forwards SIGTERM and SIGINT to it,
and once it ends stops every process left beneath: SIGTERM, then SIGKILL after the grace
(``AIRFLOW_GPU_KILL_GRACE``, 2 s). Its exit status is the runtime's. Standard library only, no relative import.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import time

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
KILL_WAIT = 10.0  # how long SIGKILLed processes may take to go, in the job's reaper


def started_at(pid: int) -> str | None:
    """The start time of a process (clock ticks after boot), or ``None`` when it is gone (as ``host/workers.py``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[19].decode()
    except OSError:
        return None


def _stat(pid: int) -> tuple[str, int] | None:
    """A process's state letter and parent pid, or ``None`` when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return fields[0].decode(), int(fields[1])


def _children() -> dict[int, list[int]]:
    """``{parent pid: [child pids]}`` of every process this user may see."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _stat(int(name))) is not None:
            children.setdefault(stat[1], []).append(int(name))
    return children


def _pidfds() -> bool:
    """Whether this kernel has pidfds (Linux >= 5.3)."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (OSError, AttributeError):
        return False
    return True


PIDFDS = _pidfds()


class Pinned:
    """One process, pinned by a pidfd: its pid may be reused by another process, the pidfd never names that one.

    On a kernel without pidfds (Linux < 5.3) it holds the pid and its start time, and a pid reused between a check
    and a signal could be signalled (best effort there).

    :raises ProcessLookupError: when the process is gone
    """

    def __init__(self, pid: int) -> None:
        self.pid, self.handle, self.start = pid, -1, started_at(pid)
        if PIDFDS:
            try:
                self.handle = os.pidfd_open(pid)
            except OSError:
                raise ProcessLookupError(pid) from None
        elif self.start is None:
            raise ProcessLookupError(pid)

    def exists(self) -> bool:
        """Whether the process has not been reaped yet (a zombie still exists)."""
        try:
            self.send(0)
        except ProcessLookupError:
            return False
        return True

    def ended(self) -> bool:
        """Whether the process has exited (a zombie has), reaped or not."""
        if self.handle >= 0:
            return bool(select.select([self.handle], [], [], 0)[0])  # a pidfd is readable once it has exited
        stat = _stat(self.pid)
        return stat is None or stat[0] == "Z" or started_at(self.pid) != self.start

    def send(self, sig: int) -> None:
        """Signal it (0: no signal, only the check).

        :raises ProcessLookupError: when it has been reaped
        """
        if self.handle >= 0:
            signal.pidfd_send_signal(self.handle, sig)
        elif PIDFDS or self.start is None or started_at(self.pid) != self.start:  # let go, or gone
            raise ProcessLookupError(self.pid)
        else:
            os.kill(self.pid, sig)

    def close(self) -> None:
        """Let it go: it is never signalled again (the pidfd closed)."""
        handle, self.handle, self.start = self.handle, -1, None  # first: a signal handler sees it let go
        if handle >= 0:
            os.close(handle)


def signal_descendants(sig: int) -> list[int]:
    """Send ``sig`` to every descendant of this process; return those that are not zombies.

    Each pid is pinned first (:class:`Pinned`), then its parent read from ``/proc``: it is signalled only when it and
    its parent (this process or a descendant pinned before it) still exist after that read, so the read was theirs.
    """
    me, children = os.getpid(), _children()
    pinned: dict[int, Pinned] = {}
    running = []
    queue = list(children.get(me, ()))
    try:
        while queue:
            pid = queue.pop()
            try:
                process = Pinned(pid)
            except ProcessLookupError:
                continue
            stat = _stat(pid)
            parent = pinned.get(-1 if stat is None else stat[1])
            if stat is None or not process.exists() or (stat[1] != me and (parent is None or not parent.exists())):
                process.close()  # not (any more) the process that the snapshot saw beneath us
                continue
            pinned[pid] = process
            with contextlib.suppress(ProcessLookupError):
                process.send(sig)
            if stat[0] != "Z":
                running.append(pid)
            queue.extend(children.get(pid, ()))
    finally:
        for process in pinned.values():
            process.close()
    return running


def has_children() -> bool:
    """Reap this process's ended children; whether any child is left (for a subreaper: any descendant)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        return False
    return True


def become_subreaper() -> None:
    """Make this process the subreaper of its descendants (Linux >= 3.4)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def stop_all(grace: float) -> list[int]:
    """SIGTERM to every descendant, SIGKILL after ``grace`` seconds; the zombies reaped. The pids left at the end."""
    if not has_children():  # no child, so no descendant: nothing to look for in every process of the host
        return []
    running = signal_descendants(signal.SIGTERM)
    for sig, wait in ((None, grace), (signal.SIGKILL, KILL_WAIT)):
        if sig is not None and running:
            running = signal_descendants(sig)
        deadline = time.monotonic() + wait
        while running and time.monotonic() < deadline:
            time.sleep(0.05)
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-1, os.WNOHANG)[0] > 0:
                    pass
            running = signal_descendants(0)
    return running


def reap_main(runtime: str, argv: list[str]) -> int:
    """Run ``runtime ENVELOPE RESULT`` beneath this subreaper, stop what it left; the runtime's exit status.

    :param runtime: the runtime's archive (or its ``__main__.py``)
    """
    import subprocess  # here, not at the top: the local supervisor loads this file before each task (~10 ms of CPU)

    with contextlib.suppress(OSError):
        become_subreaper()
    grace = float(os.environ.get("AIRFLOW_GPU_KILL_GRACE", "2"))
    child = subprocess.Popen([sys.executable, runtime, *argv])

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(OSError):
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    status = child.wait()
    left = stop_all(grace)
    if left:
        print(f"[gpu] processes {left} outlived SIGKILL by {KILL_WAIT:g}s", file=sys.stderr, flush=True)
    return status if status >= 0 else 128 - status
