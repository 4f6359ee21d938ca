"""How the task process stops: SIGTERM unwinds the function, a child gets the signals, the worker's death kills it."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

from .output import say
from .protocol import PREFIX


class Terminated(SystemExit):
    """SIGTERM, raised in the function by :func:`exit_on_sigterm`."""


def exit_on_sigterm() -> None:
    """SIGTERM raises :class:`Terminated` in the function: its ``finally`` blocks run (a last checkpoint).

    Also as PID 1 of a container, which the kernel spares the signals it does not handle. A handler of the
    function's own replaces this one. Once the function has unwound, the process ends as SIGTERM ends it.
    """
    import signal

    def terminate(number: int, _: Any) -> None:
        # once: the same SIGTERM often comes twice (to the process and to its group), and a second one raised while
        # the function unwinds would escape its finally blocks; what follows the grace is SIGKILL
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated(128 + number)

    signal.signal(signal.SIGTERM, terminate)


def end_by_sigterm(cleanup: Callable[[], None]) -> int:
    """End this process as an unhandled SIGTERM does; PID 1, which that spares, exits with status 143.

    :param cleanup: called after the log line, before the process ends (the staged checkpoint folders)
    """
    import signal

    say(f"{PREFIX} stopped by SIGTERM", stderr=True)
    sys.stdout.flush()
    cleanup()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1)  # the signal is delivered meanwhile, unless this is PID 1
    return 128 + signal.SIGTERM


def run_child(argv: list[str], environ: dict[str, str] | None = None) -> int:
    """Run ``argv`` to its end, passing SIGTERM and SIGINT on (``docker stop`` reaches PID 1, ``on_kill`` the group).

    :return: its exit status; 128 + N when signal N ended it, as a shell reports it
    """
    import signal
    import subprocess

    process = subprocess.Popen(argv, env=environ)  # the task's own command, no shell
    forward = {
        sig: signal.signal(sig, lambda number, _: process.send_signal(number))
        for sig in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        status = process.wait()
    finally:
        for sig, previous in forward.items():
            signal.signal(sig, previous)
    return 128 - status if status < 0 else status


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the worker that started it dies (best effort)."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
