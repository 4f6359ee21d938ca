"""A Ray job whose task instance ended while no worker followed it, stopped then (the API server, the scheduler).

A worker killed with SIGKILL cannot stop its job, and a durable job (``durable.py``) outlives its worker on purpose.
When such a task instance ends, Airflow tells the listeners where it ends: the API server when a user marks it
failed or success (``on_task_instance_failed`` / ``_success``), the scheduler when it finds the worker's heartbeat
gone and fails it or schedules its retry (``on_task_instance_failed``). This listener reads the Ray job the task's
tries recorded (the task state store) and stops and deletes it, unless a later try takes it over (a durable job
whose task instance is up for retry). It acts only on a job whose metadata names that very task instance and this
deployment, on a cluster this process's policy allows (``connection.endpoint``), in a thread: neither the API's
request nor the scheduler's loop waits for Ray. What it cannot reach (a record cleared on success, a cluster the
API server cannot reach) the next Ray task of the worker's host still reaps (``orphans.py``).
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from airflow.listeners import hookimpl

log = logging.getLogger(__name__)
#: the states of an ended task instance (up_for_retry: only a job no later try takes over is stopped)
ENDED = ("failed", "success", "skipped", "upstream_failed", "removed")


def _record(task_instance: Any) -> dict[str, Any] | None:
    """The Ray job the task instance's tries recorded (``durable.KEY``), read from the metadata database."""
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from airflow_gpu_provider.backends.ray.durable import KEY

    model = TaskStateStoreModel
    with create_session() as session:
        value = session.scalar(
            select(model.value).where(
                model.dag_id == task_instance.dag_id,
                model.run_id == task_instance.run_id,
                model.task_id == task_instance.task_id,
                model.map_index == (-1 if task_instance.map_index is None else task_instance.map_index),
                model.key == KEY,
            )
        )
    while isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, dict) and isinstance(value.get("id"), str) else None


def reap(identity: dict[str, str], record: dict[str, Any], *, retrying: bool) -> str | None:
    """Stop and delete the recorded job if it is this task instance's and no later try takes it over; its id."""
    from airflow_gpu_provider.backends.ray import durable, job
    from airflow_gpu_provider.backends.ray.connection import endpoint

    cluster, submission_id = str(record.get("cluster", "")), str(record["id"])
    conn_id, address = (None, cluster) if "://" in cluster else (None if cluster == "(default)" else cluster, None)
    client = endpoint(conn_id, address, owner="The Ray listener").jobs()
    if job.status(client, submission_id) is None:
        return None
    metadata = client.get_job_info(submission_id).metadata or {}
    if not durable.mine(metadata, identity) or (retrying and metadata.get("durable") == "true"):
        return None
    job.stop(client, submission_id)
    job.delete(client, submission_id, log)
    log.warning("Stopped Ray job %s: its task instance %s ended", submission_id, identity)
    return submission_id


def _ended(task_instance: Any) -> None:
    if not type(task_instance).__module__.startswith("airflow.models"):
        return  # a task runner's own task instance: its try stops its job itself (backend.py)
    state = str(getattr(task_instance.state, "value", task_instance.state))
    if state not in (*ENDED, "up_for_retry"):
        return
    try:
        record = _record(task_instance)
    except Exception as err:  # noqa: BLE001 - no task state store (Airflow < 3.3), a database error: said, not raised
        log.info("Cannot read the Ray job of %s.%s: %s", task_instance.dag_id, task_instance.task_id, err)
        return
    if record is None:
        return
    from airflow_gpu_provider.backends.ray.durable import identity_of

    identity = identity_of(task_instance)

    def stop() -> None:
        try:
            reap(identity, record, retrying=state == "up_for_retry")
        except Exception as err:  # noqa: BLE001 - a listener never fails Airflow's own work: the log says why
            log.warning("Could not stop the Ray job of %s (%s): the next Ray task of its host will.", identity, err)

    threading.Thread(target=stop, name="airflow-gpu-ray-reaper", daemon=True).start()


@hookimpl
def on_task_instance_failed(previous_state: Any, task_instance: Any, error: Any) -> None:
    """A task instance failed, or is up for retry: stop its Ray job unless a later try takes it over."""
    _ended(task_instance)


@hookimpl
def on_task_instance_success(previous_state: Any, task_instance: Any) -> None:
    """A task instance was marked success: stop its Ray job if one still runs."""
    _ended(task_instance)
