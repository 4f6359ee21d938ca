"""One Slurm job's life: its folder on the shared folder, submitted, followed into the task log, read back, removed.

The job's files live in a folder of the worker's own on the cluster's shared folder
(``<shared_dir>/airflow-gpu-<uid>/job-*``, 0700): the batch script, the runtime archive, the envelope, and what the
job writes (its output, its result, its exit record). A try follows the job by looking at it every poll interval:
it logs the output as it grows, says why a pending job waits (each new reason once) and when Slurm requeued it (the
same id: this try goes on following it). The job's end comes from the controller, else from ``sacct`` where the
cluster keeps accounting, else from the job's own exit record (a controller forgets a job ``MinJobAge`` after its
end).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from airflow_gpu_provider.backends.slurm.plan import SlurmPlan
from airflow_gpu_provider.backends.slurm.script import ENVELOPE, EXIT, RESULT, SCRIPT, batch_script
from airflow_gpu_provider.backends.slurm.states import JobInfo, never_starts, pending_reason
from airflow_gpu_provider.exceptions import GpuTaskError, GpuUnavailableError
from airflow_gpu_provider.host.state import check_owned, private_dir
from airflow_gpu_provider.task.output import LineSplitter, TaskLog
from airflow_gpu_provider.task.result import read_result_file
from airflow_gpu_provider.task.runtime_zip import FILE_NAME, archive

_JOB_FOLDER = re.compile(r"job-[A-Za-z0-9_]{8}")


class Pending(Exception):
    """The job waited ``pending_timeout`` for its resources (it was not cancelled)."""


def base(shared_dir: str) -> Path:
    """The worker's own folder on the shared folder (0700; made when missing, else checked)."""
    return private_dir(os.path.join(shared_dir, f"airflow-gpu-{os.geteuid()}"))


def make_folder(plan: SlurmPlan, shared_dir: str, python: str, envelope: dict[str, Any]) -> str:
    """A new job folder with the script, the runtime and the envelope; its path."""
    root = base(shared_dir)
    folder = tempfile.mkdtemp(prefix="job-", dir=root)
    (Path(folder) / FILE_NAME).write_bytes(archive())
    (Path(folder) / ENVELOPE).write_text(json.dumps(envelope))
    (Path(folder) / SCRIPT).write_text(batch_script(plan, folder, python, str(root / "envs")))
    (root / "envs").mkdir(mode=0o700, exist_ok=True)
    return folder


def own_folder(shared_dir: str, recorded: Any) -> str | None:
    """A recorded folder when it is one of this worker's job folders (a record is data: checked); else ``None``."""
    if not isinstance(recorded, str):
        return None
    root = os.path.join(shared_dir, f"airflow-gpu-{os.geteuid()}")
    folder = Path(recorded)
    if folder.parent != Path(root) or not _JOB_FOLDER.fullmatch(folder.name):
        return None
    try:
        check_owned(folder, os.lstat(folder), directory=True)
    except (OSError, GpuTaskError):
        return None
    return str(folder)


def remove_folder(folder: str) -> None:
    """Remove a job folder (never raises: a folder already gone is fine)."""
    shutil.rmtree(folder, ignore_errors=True)


class Output:
    """The job's output file, logged as it grows (each complete line once)."""

    def __init__(self, folder: str, log: logging.Logger, offset: int = 0) -> None:
        self.path, self.offset = Path(folder) / "output.log", offset
        self.splitter, self.task_log = LineSplitter(), TaskLog(log)

    def read(self) -> None:
        """Log what was written since the last read."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        for line in self.splitter.feed(data):
            self.task_log(line)

    def close(self) -> None:
        """Log the rest."""
        self.read()
        for line in self.splitter.flush():
            self.task_log(line)
        self.task_log.flush()


def exit_record(folder: str, job_id: str) -> JobInfo | None:
    """The job's end as its own script recorded it (``exit``), or ``None`` when it wrote none."""
    try:
        text = (Path(folder) / EXIT).read_text().strip()
    except OSError:
        return None
    status = int(text) if text.isdigit() else 1
    return JobInfo(job_id, "COMPLETED" if status == 0 else "FAILED", status=status)


def look(client: Any, job_id: str, folder: str) -> JobInfo | None:
    """The job now: the controller's word, else accounting's, else its exit record; ``None`` when nothing knows."""
    return client.job(job_id) or client.accounting(job_id) or exit_record(folder, job_id)


def follow(
    client: Any,
    job_id: str,
    folder: str,
    log: logging.Logger,
    *,
    poll: float,
    pending_timeout: float | None,
    stopped: Callable[[], bool] = lambda: False,
) -> JobInfo:
    """Log the job's output and why it waits until it ends; its last state.

    :param pending_timeout: seconds it may wait for its resources (``None``: as long as it takes); then
        :class:`Pending`. A reason that no load will ever end raises :class:`GpuUnavailableError` at once.
    :param stopped: whether this try stopped the job (it is then followed to its end without a pending limit)
    """
    output, reason, restarts, since = Output(folder, log), "", 0, time.monotonic()
    try:
        while True:
            info = look(client, job_id, folder)
            output.read()
            if info is None:
                raise GpuTaskError(
                    f"Slurm job {job_id} is gone: the controller forgot it (MinJobAge) and it left no exit record "
                    "(killed before its script ended, on a cluster without accounting). Its result is lost."
                )
            if info.restarts > restarts:
                restarts = info.restarts
                log.warning("Slurm requeued job %s (restart %s): this try follows it again", job_id, restarts)
                since = time.monotonic()
            if not info.active:
                return info
            if info.state == "PENDING" and info.reason != reason and info.reason not in ("", "None"):
                reason = info.reason
                log.info("Slurm job %s %s", job_id, pending_reason(reason))
            if info.state == "PENDING" and never_starts(info.reason) and not stopped():
                raise GpuUnavailableError(f"Slurm job {job_id} can never start: it {pending_reason(info.reason)}.")
            waited = time.monotonic() - since
            if info.state == "PENDING" and pending_timeout is not None and waited > pending_timeout and not stopped():
                raise Pending(f"Slurm job {job_id} {pending_reason(info.reason)} for {waited:.0f}s (pending_timeout)")
            time.sleep(poll)
    finally:
        output.close()


def results(folder: str, nodes: int) -> dict[str, Any] | None:
    """The runtime's result: the one node's, or of several the first to fail (else node 0's)."""
    if nodes == 1:
        return read_result_file(Path(folder) / RESULT)
    found = {rank: read_result_file(Path(folder) / f"result-{rank}.json") for rank in range(nodes)}
    failed = [(r.get("error", {}).get("time", 0), rank) for rank, r in found.items() if r and not r.get("ok")]
    if failed:
        return {**found[min(failed)[1]], "node_rank": min(failed)[1]}  # type: ignore[dict-item]
    return found[0]
