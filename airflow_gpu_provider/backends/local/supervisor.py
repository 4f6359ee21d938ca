"""The local task's supervisor: the subreaper of all that a task starts, holding its GPUs until all of it has ended.

Rule T1 (docs/security.md: a task's processes are found whatever they do): the worker starts ``python -I -S
.../backends/local/supervisor.py OPTIONS -- ARGV`` in a session of its own, with the GPU lock descriptors: a script
of the standard library alone, in an isolated interpreter, so it starts in milliseconds, and nothing of the task's
environment (``PYTHONPATH``, ``PYTHONHOME``) or of site-packages reaches it. The supervisor makes itself a child
subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``) and starts the task process (``ARGV``) in another session. A process
whose parent ends is then re-parented to the supervisor, never to init, whatever it did to its process group, session
or environment (``setpgid``, ``setsid``, ``env -i``, a double fork): the task's processes are exactly the
supervisor's descendants, found by walking ``/proc`` from it, and the supervisor has no child left exactly when none
of them is left (``waitpid``, which reaps their zombies meanwhile): once it has none, nothing is looked for.

When the task process ends, when the worker asks (SIGTERM: ``on_kill``) or when the worker dies, every descendant is
stopped: SIGTERM, then SIGKILL after the grace period, until the supervisor has no child. Only then does it exit, and
the GPU locks go with it. A descendant is signalled through a pidfd, after it was pinned and found still to be a
child of a pinned descendant (or of the supervisor): a pid that another process reuses is never signalled (the pinned
subreaper, ``runtime/reaper.py``, which a job's entrypoint runs too, loaded here by its path). SIGUSR1
stops the task at once, without a grace period (the next task stopping what a dead worker left).

The supervisor tells the worker on the status descriptor, one line each: ``exit N`` (the task process's status, as
``Popen.returncode`` gives it) and, if it comes to that, ``left P,Q`` (processes that outlived SIGKILL by
:data:`KILL_WAIT` seconds: in the GPU driver; the supervisor still holds the locks and waits for them).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Sequence

if __package__:
    from airflow_gpu_provider.runtime import reaper
else:  # run as a script (python -I -S): the pinned subreaper from its folder, with nothing else of the package
    # by its source's folder: __file__ may be the copy compiled into the state dir (host/state.py compiled_script);
    # last on the path, after the standard library; no importlib.util (milliseconds of CPU before each task)
    sys.path.append(os.path.join(os.path.dirname(sys._getframe(0).f_code.co_filename), "..", "..", "runtime"))
    reaper = __import__("reaper")

Pinned, started_at, signal_descendants = reaper.Pinned, reaper.started_at, reaper.signal_descendants
SCRIPT = os.path.abspath(__file__)
MODULE = "airflow_gpu_provider/backends/local/supervisor.py"  # how a supervisor is told in a process's command line
PREFIX = "[gpu]"  # the runtime's (runtime/protocol.py): the supervisor imports nothing of the provider
KILL_WAIT = 30.0  # SIGKILL is not instant for a process in the GPU driver
STOP_NOW = signal.SIGUSR1


class Supervisor:
    """The loop: wait for the task process, the worker's death or a signal; reap zombies; stop the tree.

    :param worker: the worker (its pidfd is readable once it has exited), or ``None`` when it is gone already
    :param report: writes one status line to the worker
    """

    def __init__(self, grace: float, worker: reaper.Pinned | None, report: Callable[[str], None]) -> None:
        self.grace, self.worker, self.report = grace, worker, report
        self.requests: set[int] = set()
        self.task_pid = 0
        self.exit: int | None = None
        self._wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_write)
        for sig in (signal.SIGTERM, STOP_NOW, signal.SIGCHLD):
            signal.signal(sig, lambda number, _: self.requests.add(number))

    def start(self, argv: Sequence[str]) -> None:
        """Start the task process in a session of its own (it inherits the lock descriptors and the output)."""
        self.task_pid = os.posix_spawn(
            argv[0], list(argv), os.environ, setsid=True, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ)
        )

    def _wait(self, timeout: float) -> None:
        watched = [self._wake_read, *([self.worker.handle] if self.worker and self.worker.handle >= 0 else [])]
        with contextlib.suppress(InterruptedError):
            select.select(watched, [], [], timeout)
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_read, 256):
                pass

    def _worker_gone(self) -> bool:
        return self.worker is not None and self.worker.ended()

    def reap(self) -> bool:
        """Reap every ended child (the task process's status is kept); whether any child is left."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            if pid == 0:
                return True
            if pid == self.task_pid:
                self.exit = os.waitstatus_to_exitcode(status)
                self.report(f"exit {self.exit}")

    def run(self) -> None:
        """Until the task process ends or the task is to be stopped; then stop every descendant."""
        while self.reap() and self.exit is None:
            if self.requests & {signal.SIGTERM, STOP_NOW} or self._worker_gone():
                break
            self._wait(1.0)
        why = "the task process ended" if self.exit is not None else "the task is stopped"
        if self._worker_gone():
            why = "its worker died"
        self.stop(why)

    def stop(self, why: str) -> None:
        """SIGTERM to every descendant, SIGKILL after the grace period; return when none is left."""
        if not self.reap():  # no child, so no descendant: an orphan would have become our child
            return
        running = signal_descendants(signal.SIGTERM)
        if running and self.exit is not None:
            self._say(f"stopping processes {running} that the task left running ({why})")
        deadline = time.monotonic() + self.grace
        while running and time.monotonic() < deadline and STOP_NOW not in self.requests:
            self._wait(0.05)
            self.reap()
            running = signal_descendants(0)
        kill_deadline, reported = time.monotonic() + KILL_WAIT, False
        while self.reap():
            left = signal_descendants(signal.SIGKILL)
            if left and not reported and time.monotonic() > kill_deadline:
                self.report("left " + ",".join(map(str, left)))
                reported = True
            self._wait(0.05 if time.monotonic() < kill_deadline else 1.0)

    def _say(self, message: str) -> None:
        with contextlib.suppress(OSError):  # the worker may be gone, and its end of the output with it
            print(f"{PREFIX} {message}", file=sys.stderr, flush=True)


def _pin_worker(identity: str) -> reaper.Pinned | None:
    """The worker ``host:pid:start``, or ``None`` when it has exited already."""
    pid, start = identity.split(":")[1:]
    try:
        worker = Pinned(int(pid))
    except ProcessLookupError:
        return None
    if worker.start != start or started_at(int(pid)) != start:  # read after pinning: still that process
        worker.close()
        return None
    return worker


def main(argv: list[str]) -> int:
    """Run ``ARGV`` under supervision: ``--grace SECONDS --worker IDENTITY --status FD -- ARGV...``."""
    split = argv.index("--")
    options = dict(zip(argv[:split:2], argv[1:split:2], strict=True))
    status = int(options["--status"])
    os.set_inheritable(status, False)

    def report(line: str) -> None:
        with contextlib.suppress(OSError):
            os.write(status, f"{line}\n".encode())

    reaper.become_subreaper()
    supervisor = Supervisor(float(options["--grace"]), _pin_worker(options["--worker"]), report)
    if supervisor.worker is None:
        return 1  # the worker died before its task started: there is nothing to run it for
    supervisor.start(argv[split + 1 :])
    supervisor.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
