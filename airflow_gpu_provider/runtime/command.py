"""A command task (``mode: command``): the runtime becomes the command, or runs it as a child while sampling."""

from __future__ import annotations

import os
import sys
from typing import Any

from .escalation import error_record
from .output import say
from .protocol import EXIT_CANNOT_START, PREFIX
from .signals import run_child


def runtime_archive() -> str | None:
    """The archive this runtime runs from (``runtime.pyz``); ``None`` for an unpacked runtime."""
    archive = getattr(__spec__.loader, "archive", None)  # a zipimporter's: the .pyz file
    return os.path.abspath(archive) if archive else None


def importable_runtime(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with the runtime's archive first on ``PYTHONPATH``, for a command or script it starts.

    So the script can import ``airflow_gpu_runtime`` (``from airflow_gpu_runtime import resume``) on every backend.
    """
    archive = runtime_archive()
    if archive is None:
        return environ
    rest = [part for part in environ.get("PYTHONPATH", "").split(os.pathsep) if part and part != archive]
    return {**environ, "PYTHONPATH": os.pathsep.join([archive, *rest])}


def run_command(envelope: dict[str, Any], *, sampled: bool) -> tuple[dict[str, Any], int]:
    """Run the command (no shell): this process becomes it, or, while a sampler runs here, it runs as a child.

    :param sampled: a sampler runs in this process, which must then outlive the command
    :return: the result envelope and the exit status (the command's; 127 when it cannot start)
    """
    command = [str(part) for part in envelope["command"]]
    environ = importable_runtime(dict(os.environ))
    sys.stdout.flush()
    try:
        if not sampled:
            os.execvpe(command[0], command, environ)  # noqa: S606 - an argument list, no shell; does not return
        status = run_child(command, environ)
    except OSError as exc:
        say(f"{PREFIX} cannot run {command[0]!r}: {exc}", stderr=True)
        return {"ok": False, "error": error_record(exc)}, EXIT_CANNOT_START
    return command_result(status), status


def command_result(status: int) -> dict[str, Any]:
    """A command's result envelope: its exit status decides (``result_value`` words the failure)."""
    return {"ok": True, "return_value": None} if status == 0 else {"ok": False, "exit_status": status}
