"""One Ray job's life through the Jobs API: submitted with its files, followed into the task log, read back, removed.

The Ray backend runs these steps in one worker try (``run``), across a deferral (``start``, then ``resume``), or
for a job an earlier try left running (reattach): each step is one function. The runtime prints its result as
the job's last log line (``[gpu] result: {...}``): that line is taken out of the log and read, nothing else
travels back from a job.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_gpu_provider.backends.ray.plan import DRIVER, ENVELOPE, NODES, REAPER, RayPlan
from airflow_gpu_provider.backends.ray.reaper import ENVIRONMENT
from airflow_gpu_provider.backends.ray.reaper import ON_WORKER as CHECKPOINT_ON_WORKER
from airflow_gpu_provider.exceptions import GpuTaskError, RemoteTaskError
from airflow_gpu_provider.task.output import LineSplitter, ResultLines, TaskLog
from airflow_gpu_provider.task.result import MAX_RESULT_BYTES, TaskResult, result_in_log, result_of_lines, task_result
from airflow_gpu_provider.task.runtime_zip import FILE_NAME, archive

if TYPE_CHECKING:
    from airflow_gpu_provider.backends.ray.connection import Endpoint

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def submit(
    client: Any, plan: RayPlan, envelope: dict[str, Any], submission_id: str, log: logging.Logger, *, durable: bool
) -> None:
    """Submit the job with its ``working_dir``: the runtime, the envelope, the task's variables, reaper and driver.

    Ray uploads the folder when the job is submitted (once per content hash); the worker's copy is removed then.
    The reaper takes the envelope and the variables out of the node's copy before the task runs.
    A checkpoint folder the worker made is named to the reaper, which fails the job on a node that lacks it.
    The job's metadata names its task instance, its worker, whether a later try may take it over (``durable``) and
    the Airflow deployment that can tell whether its task instance has ended (``orphans.py``).
    """
    from airflow_gpu_provider.host.workers import deployment, worker_identity

    folder = Path(tempfile.mkdtemp(prefix="airflow-gpu-ray-"))
    try:
        (folder / FILE_NAME).write_bytes(archive())
        for name, content in ((ENVELOPE, envelope), (ENVIRONMENT, plan.environment)):
            with os.fdopen(os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
                json.dump(content, handle)
        shutil.copyfile(Path(__file__).with_name("reaper.py"), folder / REAPER)
        if plan.nodes is not None:
            spec = {**plan.nodes, "pending_timeout": plan.pending_timeout}
            (folder / NODES).write_text(json.dumps(spec))
            shutil.copyfile(Path(__file__).with_name("nodes.py"), folder / DRIVER)
        runtime_env = {**plan.runtime_env, "working_dir": str(folder)}
        location = plan.request.checkpoint
        if location is not None and not location.is_uri and os.path.isdir(location.path):  # each node checks it
            runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), CHECKPOINT_ON_WORKER: location.path}
        client.submit_job(
            entrypoint=plan.entrypoint,
            runtime_env=runtime_env,
            submission_id=submission_id,
            metadata={
                **plan.metadata,
                "worker": worker_identity(),
                "durable": str(durable).lower(),
                "deployment": deployment(),
            },
            **plan.submit,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    log.info("Submitted Ray job %s: %s", submission_id, plan.entrypoint)


def status(client: Any, submission_id: str) -> str | None:
    """The job's status (``PENDING``, ``RUNNING``, ``SUCCEEDED``...), ``None`` when the cluster has no such job."""
    try:
        return str(client.get_job_status(submission_id))
    except RuntimeError as err:  # the Jobs API answers 404 as a RuntimeError
        if "does not exist" in str(err) or "404" in str(err):
            return None
        raise


def wait_while_pending(client: Any, submission_id: str, timeout: float, poll: float) -> str | None:
    """Wait while the job waits for the cluster's resources, at most ``timeout`` seconds; its status then."""
    deadline = time.monotonic() + timeout
    while True:
        now = status(client, submission_id)
        if now != "PENDING" or time.monotonic() >= deadline:
            return now
        time.sleep(min(poll, max(deadline - time.monotonic(), 0.01)))


class JobLog:
    """The job's output as task log lines, without the result line, which it keeps."""

    def __init__(self, log: logging.Logger) -> None:
        self.results, self.splitter, self.task_log = ResultLines(MAX_RESULT_BYTES), LineSplitter(), TaskLog(log)

    @property
    def result(self) -> dict[str, Any] | None:
        """The job's result envelope: its last result line (:class:`~...task.output.ResultLines`), if any."""
        return result_of_lines(self.results, "the Ray job")

    def feed(self, text: str) -> None:
        """Log what ``text`` completes."""
        for line in self.splitter.feed(self.results.feed(text.encode())):
            self.task_log(line)

    def close(self) -> None:
        """Log what is left."""
        for line in self.splitter.feed(self.results.flush()):
            self.task_log(line)
        for line in self.splitter.flush():
            self.task_log(line)
        self.task_log.flush()


def follow(client: Any, submission_id: str, log: logging.Logger) -> dict[str, Any] | None:
    """Log the job's output from its start until it ends (``tail_job_logs``); return its result envelope."""
    job_log = JobLog(log)

    async def tail() -> None:
        async for chunk in client.tail_job_logs(submission_id):
            job_log.feed(chunk)

    try:
        asyncio.run(tail())
    finally:
        job_log.close()
    return job_log.result if job_log.result is not None else result_in_logs(client, submission_id)


def log_all(client: Any, submission_id: str, log: logging.Logger) -> dict[str, Any] | None:
    """Log a job's whole output at once (after a deferral: nobody followed it); return its result envelope."""
    job_log = JobLog(log)
    job_log.feed(str(client.get_job_logs(submission_id)))
    job_log.close()
    return job_log.result


def result_in_logs(client: Any, submission_id: str) -> dict[str, Any] | None:
    """The result line of the job's log, read again (a log stream that ended early)."""
    return result_in_log(str(client.get_job_logs(submission_id))[-(MAX_RESULT_BYTES + 1024) :], "the Ray job")


def ended(client: Any, submission_id: str) -> Any:
    """Wait for the job's end; its ``JobDetails``."""
    while (now := status(client, submission_id)) not in (*TERMINAL, None):
        time.sleep(0.2)
    if now is None:
        raise GpuTaskError(f"Ray job {submission_id} was deleted before its result could be read.")
    return client.get_job_info(submission_id)


def outcome(info: Any, result: dict[str, Any] | None) -> TaskResult:
    """The ended job's :class:`TaskResult`, or its typed error (``task/result.py``, as on every backend)."""
    where = f"Ray job {info.submission_id}"
    if result is not None:
        return task_result(result, 0, where=where)
    if str(info.status) == "STOPPED":
        raise GpuTaskError(f"{where} was stopped before it gave a result.")
    if info.driver_exit_code is None:  # it never started: e.g. its runtime_env's installation failed
        raise RemoteTaskError(f"{where} failed before the task started: {info.message}")
    return task_result(None, info.driver_exit_code, where=where)


def stop(client: Any, submission_id: str, timeout: float = 60.0) -> None:
    """Stop the job (SIGTERM, then SIGKILL, as Ray stops a job) and wait for its end; never raises."""
    with contextlib.suppress(Exception):
        client.stop_job(submission_id)
        deadline = time.monotonic() + timeout
        while status(client, submission_id) not in (*TERMINAL, None) and time.monotonic() < deadline:
            time.sleep(0.2)


def delete(client: Any, submission_id: str, log: Any) -> None:
    """Delete an ended job (its record and log) from the cluster; never raises."""
    try:
        client.delete_job(submission_id)
    except Exception as err:  # noqa: BLE001 - a job deleted by hand, a cluster gone: said, not raised
        log.warning("Could not delete Ray job %s: %s", submission_id, err)


def node_of(endpoint: Endpoint, info: Any, result: dict[str, Any] | None) -> str:
    """The node the job (rank 0's on several machines) ran on: its address and id, as far as Ray says."""
    node_id = (result or {}).get("node") or getattr(info, "driver_node_id", None) or ""
    if not node_id:
        return "unknown"
    try:
        from ray.util.state.common import GetApiOptions, StateResource

        node = endpoint.state().get(StateResource.NODES, node_id, GetApiOptions(timeout=10))
    except Exception:  # noqa: BLE001 - the state API is optional to a Jobs API endpoint
        node = None
    return f"{node.node_ip} ({node_id[:12]})" if node is not None else node_id[:12]
