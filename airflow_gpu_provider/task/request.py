"""What every backend receives and returns: one task try as a :class:`TaskRequest`, its :class:`TaskResult`.

Operators build the request after templates are rendered; a backend only translates it (``plan``) and runs it
(``run``). The request holds settings and the runtime envelope, never a backend's own options.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_gpu_provider.exceptions import GpuOutOfMemoryError, GpuTaskError, HostOutOfMemoryError, RemoteTaskError
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.checkpoint import CheckpointLocation
from airflow_gpu_provider.task.missing_gpu import POLICIES, MissingGpuPolicy, OnMissingGpu


@dataclass(frozen=True)
class TaskRequest:
    """Everything a backend needs to run one task try, independent of the backend.

    :param envelope: the runtime envelope from :mod:`airflow_gpu_provider.payload` (the backend adds ``summary``)
    :param on_missing_gpu: the name of a :data:`~airflow_gpu_provider.task.missing_gpu.POLICIES` entry
    :param labels: identity of the task try (dag_id, task_id, run_id, try_number, map_index) for names and logs
    :param num_nodes: machines the envelope runs on at once (a multi-node launch); ``resources`` are per node
    :param rendezvous_port: the port a multi-node launch meets on (``None``: the backend's default)
    :param min_gpu_memory: GPUs must have more memory than this (bytes): a try after a GPU out-of-memory failure,
        on the backends that pick devices themselves (local, Docker)
    :param checkpoint: the try's checkpoint folder (``task/checkpoint.py``), ``None`` for none
    """

    resources: ResourceSettings
    image: ImageSettings
    envelope: Mapping[str, Any]
    on_missing_gpu: OnMissingGpu = "fail"
    labels: Mapping[str, str] = field(default_factory=dict)
    num_nodes: int = 1
    rendezvous_port: int | None = None
    min_gpu_memory: int | None = None
    checkpoint: CheckpointLocation | None = None

    @property
    def missing_gpu(self) -> MissingGpuPolicy:
        """What to do when the GPUs are missing or busy."""
        return POLICIES[self.on_missing_gpu]

    @property
    def display_name(self) -> str:
        """``dag.task`` (plus map index), for log lines and lock holders."""
        name = f"{self.labels.get('dag_id', '?')}.{self.labels.get('task_id', '?')}"
        if self.labels.get("map_index", "-1") not in ("-1", ""):
            name += f"[{self.labels['map_index']}]"
        return name


def task_labels(ti: Any) -> dict[str, str]:
    """The identity of a task try, from its task instance: :attr:`TaskRequest.labels`."""
    names = ("dag_id", "task_id", "run_id", "try_number")
    return {**{name: str(getattr(ti, name)) for name in names}, "map_index": str(getattr(ti, "map_index", -1))}


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
    from airflow_gpu_provider.runtime.protocol import GPU_OOM, HOST_OOM  # the protocol's; not on the parse path

    profile = None if result is None else result.get("profile")
    if result is not None and not result.get("ok", False) and "exit_status" not in result:
        error = result.get("error") or {}
        details: dict[str, Any] = {"error_type": error.get("type", ""), "profile": profile}
        details.update(remote_traceback=error.get("traceback", ""), gpus=result.get("gpus"))
        if error.get("kind") == GPU_OOM:
            raise GpuOutOfMemoryError(
                f"The task ran out of GPU memory in {where} ({error.get('type')}: {error.get('message', '')}): it "
                "needs a GPU with more memory, or to use less (a smaller batch). The traceback is in the log above.",
                **details,
            )
        if error.get("kind") == HOST_OOM:
            raise HostOutOfMemoryError(
                f"The task ran out of host memory in {where} ({error.get('type')}: {error.get('message', '')}). The "
                "traceback is in the log above.",
                **details,
            )
        raise RemoteTaskError(
            f"The task raised {error.get('type', 'an error')} in {where}: {error.get('message', '')}".rstrip(": ")
            + ". The traceback is in the log above.",
            **details,
        )
    status = exit_code or (0 if result is None or result.get("ok") else int(result["exit_status"]))
    if status != 0:
        raise RemoteTaskError(f"The task process in {where} exited with status {status}.", profile=profile)
    return TaskResult(None if result is None else result.get("return_value"), profile)
