"""The launcher's process (``runtime.pyz launcher FAILURES MODULE ARGS...``): which rank failed, and how.

``accelerate launch`` answers a failed rank with its own traceback (torch elastic's ``ChildFailedError`` and its
table, or a ``CalledProcessError`` for one process), which names no cause the task's author can act on. Here the
launcher module runs in this process as ``python -m MODULE ARGS...`` would run it; when its ranks fail, each one is
named in one line instead (the first to fail first), with the signal that killed it, and written to ``FAILURES``
(JSON) for the launch's result. Any other error of the launcher is its own, and keeps its traceback.
"""

from __future__ import annotations

import json
import signal
import sys
from typing import Any

from .output import say
from .protocol import EXIT_USER_ERROR, PREFIX


def launcher_main(argv: list[str]) -> int:
    """Run ``MODULE`` as ``__main__`` with ``ARGS``; 1 with the ranks' failures written when ranks failed."""
    import runpy

    failures_to, module, *args = argv
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except Exception as exc:
        failures = rank_failures(exc)
        if failures is None:
            raise  # the launcher's own error: its traceback is the reason
        for failure in failures:
            say(f"{PREFIX} {describe(failure)}", stderr=True)
        with open(failures_to, "w", encoding="utf-8") as handle:
            json.dump(failures, handle)
        return EXIT_USER_ERROR
    return 0


def rank_failures(exc: BaseException) -> list[dict[str, Any]] | None:
    """How each failed rank ended, the cause first; ``None`` when ``exc`` is not about the ranks.

    torch elastic's ``ChildFailedError`` (several processes) has them all; ``CalledProcessError`` is accelerate's
    single process.
    """
    import subprocess

    if isinstance(exc, subprocess.CalledProcessError):
        return [rank_failure(0, None, exc.returncode)]
    failures = getattr(exc, "failures", None)
    if type(exc).__name__ != "ChildFailedError" or not isinstance(failures, dict):
        return None
    found = [rank_failure(r, getattr(f, "pid", None), int(getattr(f, "exitcode", 1))) for r, f in failures.items()]
    # the launcher stops the other ranks with SIGTERM once one has failed: those are not the cause
    return sorted(found, key=lambda failure: (failure["signal"] == "SIGTERM", failure["rank"]))


def rank_failure(rank: int, pid: int | None, exitcode: int) -> dict[str, Any]:
    """One rank's end: its exit status, or the signal that ended it (a negative exit code, as ``subprocess`` says)."""
    name = None
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
    return {"rank": int(rank), "pid": pid, "exit_status": exitcode, "signal": name}


def describe(failure: dict[str, Any]) -> str:
    """One failed rank in words: ``rank 1 (pid 4242) was killed by SIGKILL``, ``exited with status 1``, ...

    ``was stopped by SIGTERM``: the launcher stops the other ranks so once one has failed.
    """
    who = f"rank {failure['rank']}" + (f" (pid {failure['pid']})" if failure.get("pid") else "")
    if failure.get("signal") in ("SIGTERM", "SIGINT"):
        return f"{who} was stopped by {failure['signal']}"
    if failure.get("signal"):
        return f"{who} was killed by {failure['signal']}"
    return f"{who} exited with status {failure['exit_status']}"


def ranks_failed(failures: list[dict[str, Any]]) -> dict[str, Any]:
    """The result of a task whose ranks failed without an exception of theirs: each named, the cause first."""
    message = "; ".join(describe(failure) for failure in failures)
    return {"ok": False, "error": {"type": "RankFailed", "message": message, "traceback": ""}}


def read_failures(path: str) -> list[dict[str, Any]]:
    """What :func:`launcher_main` wrote to ``path`` (nothing when no rank failed, or it could not say)."""
    try:
        with open(path, encoding="utf-8") as handle:
            found = json.load(handle)
    except (OSError, ValueError):
        return []
    return [f for f in found if isinstance(f, dict) and "rank" in f] if isinstance(found, list) else []
