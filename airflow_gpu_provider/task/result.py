"""What a task try gives back: the runtime's result envelope, read safely, as a :class:`TaskResult` or an error.

Every backend reads the runtime's result (a file, a container's file, the pod's XCom, a log line) and hands it to
:func:`task_result`, which turns it into the return value and profile, or a typed error: one wording for every
backend. :func:`failure_class_of` reads the class of the failed try back from that error (the retry policy, the
metrics).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_gpu_provider.exceptions import (
    OOM_REMEDY,
    GpuInfrastructureError,
    GpuOutOfMemoryError,
    GpuTaskError,
    HostOutOfMemoryError,
    RemoteTaskError,
)
from airflow_gpu_provider.runtime import protocol

if TYPE_CHECKING:
    from airflow_gpu_provider.task.output import ResultLines

MAX_RESULT_BYTES = 64 * 2**20  # a result envelope larger than this is not an XCom value


class ResultError(GpuTaskError):
    """Where the task's result should be lies something else: a link, a FIFO, a folder, or too much data."""


def read_result_file(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The runtime's result envelope at ``path``, or ``None`` when it wrote none.

    Opened without following a symlink and without blocking on a FIFO; it must be a regular file of bounded size.
    The task's own code could have put anything there.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ResultError(f"The result file {path} cannot be read safely ({err.strerror}): it is ignored.") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ResultError(f"The result file {path} is not a regular file: it is ignored.")
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_RESULT_BYTES + 1)
    if len(data) > MAX_RESULT_BYTES:
        raise ResultError(f"The result file {path} is larger than {MAX_RESULT_BYTES} bytes.")
    return dict(json.loads(data))


def result_of_lines(lines: ResultLines, where: str) -> dict[str, Any] | None:
    """The result envelope of the last result line of an output (:class:`.output.ResultLines`), or ``None``.

    :raises ResultError: for a line that is not a JSON object (the runtime writes nothing else), or too large
    """
    if lines.too_large:
        raise ResultError(f"The result line in the output of {where} is larger than {MAX_RESULT_BYTES} bytes.")
    if lines.line is None:
        return None
    try:
        found = json.loads(lines.line)
    except ValueError:
        found = None
    if not isinstance(found, dict):
        raise ResultError(f"The result line in the output of {where} is not the runtime's: it is ignored.")
    return found


def result_in_log(text: str | bytes, where: str) -> dict[str, Any] | None:
    """The result envelope of the last result line in a log read whole (``RESULT_TO_LOG``), or ``None``."""
    from airflow_gpu_provider.task.output import ResultLines

    lines = ResultLines(MAX_RESULT_BYTES)
    lines.feed(text.encode() if isinstance(text, str) else text)
    return result_of_lines(lines, where)


@dataclass(frozen=True)
class TaskResult:
    """What a finished run produced: the function's return value (``None`` for a command) and its profile.

    :param profile: the runtime's profile of the try (``telemetry``), ``None`` when it was not sampled
    """

    return_value: Any = None
    profile: Mapping[str, Any] | None = None


def result_value(result: Mapping[str, Any] | None, exit_code: int, *, where: str) -> Any:
    """Turn the runtime's result envelope and exit status into a return value or a :class:`RemoteTaskError`."""
    return task_result(result, exit_code, where=where).return_value


def task_result(result: Mapping[str, Any] | None, exit_code: int, *, where: str) -> TaskResult:
    """The :class:`TaskResult` of the runtime's result envelope and exit status, or a :class:`RemoteTaskError`.

    The error carries the try's profile too: a failed try's (an OOM's) is the one that explains it.
    """
    profile = None if result is None else result.get("profile")
    failure = None if result is None else result.get("failure")
    if isinstance(failure, Mapping) and failure.get("class") == protocol.INFRASTRUCTURE:
        error = result.get("error") or {}  # type: ignore[union-attr]
        evidence = "; ".join(str(line) for line in failure.get("evidence") or []) or failure.get("reason")
        raise GpuInfrastructureError(
            f"The task failed in {where} because of the infrastructure, not its code ({failure.get('reason')}): "
            f"{evidence}. The next try avoids what failed.",
            failure=failure,
            error_type=str(error.get("type", "")),
            remote_traceback=str(error.get("traceback", "")),
            profile=profile,
            gpus=result.get("gpus"),  # type: ignore[union-attr]
        )
    if result is not None and not result.get("ok", False) and "exit_status" not in result:
        error = result.get("error") or {}
        details: dict[str, Any] = {"error_type": error.get("type", ""), "profile": profile}
        details.update(remote_traceback=error.get("traceback", ""), gpus=result.get("gpus"))
        if error.get("kind") == protocol.GPU_OOM:
            raise GpuOutOfMemoryError(
                f"The task ran out of GPU memory in {where} ({error.get('type')}: {error.get('message', '')}). "
                f"{OOM_REMEDY[GpuOutOfMemoryError.kind]} The traceback is in the log above.",
                **details,
            )
        if error.get("kind") == protocol.HOST_OOM:
            raise HostOutOfMemoryError(
                f"The task ran out of host memory in {where} ({error.get('type')}: {error.get('message', '')}). "
                f"{OOM_REMEDY[HostOutOfMemoryError.kind]} The traceback is in the log above.",
                **details,
            )
        if not error.get("traceback"):  # no exception of the user's code: a launch's ranks ended (launch.py)
            raise RemoteTaskError(
                f"The task failed in {where}: {error.get('message') or error.get('type')}.", **details
            )
        raise RemoteTaskError(
            f"The task raised {error.get('type', 'an error')} in {where}: {error.get('message', '')}".rstrip(": ")
            + ". The traceback is in the log above.",
            **details,
        )
    status = exit_code or (0 if result is None or result.get("ok") else int(result["exit_status"]))
    if status != 0:
        raise RemoteTaskError(f"The task process in {where} exited with status {status}.", profile=profile)
    if result is None:  # the runtime reports every run, an exec'd command's too (runtime/__main__)
        raise RemoteTaskError(
            f"The task in {where} ended with status 0 but its result is missing: it was lost (removed with its "
            "container or pod, or never written), so the try cannot count as a success.",
            profile=profile,
        )
    return TaskResult(result.get("return_value"), profile)


def failure_class_of(error: BaseException) -> tuple[str, str] | None:
    """The class of the try that ``error`` ended, and its evidence in words; ``None`` for an error of no GPU try.

    The ``gpu_failure`` record an error carries says it (``GpuTaskError.failure``); otherwise the runtime's error
    kind does (an OOM is the resources', any other error of the task's code the application's).
    """
    failure = getattr(error, "failure", None)
    if isinstance(failure, Mapping) and failure.get("class") in protocol.FAILURE_CLASSES:
        evidence = "; ".join(str(line) for line in failure.get("evidence") or []) or str(failure.get("reason") or "")
        where = failure.get("node") or failure.get("host")
        return str(failure["class"]), evidence + (f" (on {where})" if where else "")
    if isinstance(error, RemoteTaskError):
        first = (str(error).splitlines() or [""])[0].removesuffix(" The traceback is in the log above.")
        return protocol.failure_class(error.kind), first
    return None
