"""Which worker process started something, whether that worker is gone, and whether its task instance has ended.

A worker killed with SIGKILL cannot stop what it started: a task process (local backend), a container (Docker) or a
Ray job. Each is marked with the worker's identity (host, pid and the pid's start time, so that a reused pid is not
taken for it); the next task on the host stops what dead workers of this host left before it takes GPUs. A durable
container or job (a later try takes it over) is spared while its task instance has not ended
(:func:`task_instance_live`), and judged only by the workers of its own Airflow deployment (:func:`deployment`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path

#: the states of a task instance that has not ended (a try runs, is deferred, or another try will come)
UNFINISHED = ["null", "scheduled", "queued", "running", "restarting", "up_for_retry", "up_for_reschedule", "deferred"]


def started_at(pid: int) -> str | None:
    """The start time of a process (clock ticks after boot), or ``None`` when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def worker_identity() -> str:
    """The identity of the calling worker process: ``host:pid:start``."""
    return f"{socket.gethostname()}:{os.getpid()}:{started_at(os.getpid())}"


def is_dead(identity: str) -> bool:
    """Whether ``identity`` names a worker of this host that has exited (never true for another host's)."""
    parts = identity.split(":")
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit() or parts[2] == "None":
        return False  # another host's worker, not an identity this provider wrote, or a host without /proc
    return started_at(int(parts[1])) != parts[2]


def describe_holder(info: dict[str, object]) -> str:
    """Who holds a lock, and for how long: the worker that took it, or what it left running when it is gone."""
    holder, pid, since = info.get("holder", "an unknown task"), info.get("pid", "?"), info.get("since")
    held = f", for {time.time() - since:.0f}s" if isinstance(since, (int, float)) else ""
    if str(pid).isdigit() and not Path(f"/proc/{pid}").exists():
        return f"a process left by {holder} (its worker, pid {pid}, has exited{held})"
    return f"{holder} (pid {pid}{held})"


def deployment() -> str:
    """The Airflow deployment of this worker: ``[gpu_policy] deployment``, else a digest of its Execution API and home.

    The digest is of the Execution API's URL and ``AIRFLOW_HOME``.

    Two deployments sharing one Docker engine or Ray cluster (staging and production; parallel test runs) each ask
    their own API whether a durable container's or job's task instance has ended: the other's would answer "no such
    task instance" and stop what a later try is about to reattach to. The Docker authorization plugin lets a
    deployment reach only what carries its own name (``policy/authz/``).
    """
    from airflow.configuration import conf

    from airflow_gpu_provider.config import policy_values

    named = policy_values()["deployment"]
    if named:
        return named
    api = conf.get("core", "execution_api_server_url", fallback="") or conf.get("api", "base_url", fallback="")
    home = os.environ.get("AIRFLOW_HOME", "~/airflow")
    return hashlib.sha256(f"{api}\n{home}".encode()).hexdigest()[:16]


def task_instance_live(identity: Mapping[str, str], log: logging.Logger) -> bool:
    """Whether the task instance ``identity`` names (``dag_id``, ``task_id``, ``run_id``, ``map_index``) has not ended.

    Asked through the Task SDK. Outside a task (no supervisor to ask), or when Airflow cannot answer, it counts as
    live: nothing is stopped on a guess; the next task that can ask stops it.
    """
    try:
        if not all(identity.get(key) for key in ("dag_id", "task_id", "run_id")):
            raise ValueError(f"not a task instance: {dict(identity)}")
        from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

        count = RuntimeTaskInstance.get_ti_count(
            dag_id=identity["dag_id"],
            map_index=int(identity.get("map_index") or "-1"),
            task_ids=[identity["task_id"]],
            run_ids=[identity["run_id"]],
            states=UNFINISHED,
        )
    except Exception as err:  # noqa: BLE001 - no supervisor, an API error, an identity that is not ours
        log.info("Cannot tell whether the task instance of a durable job has ended (%s): it is kept.", err)
        return True
    return bool(count)
