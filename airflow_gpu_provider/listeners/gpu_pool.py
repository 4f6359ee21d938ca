"""Fail GPU tasks that could never leave the scheduler: their ``[gpu] pool`` is missing or too small.

The scheduler only logs "Tasks using non-existent pool ... will not be scheduled" and leaves such tasks waiting
forever. This listener runs in the scheduler when a DAG run starts, and fails those task instances at once
with a note that says why and how to fix it.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.listeners import hookimpl

from airflow_gpu_provider import config

log = logging.getLogger(__name__)


def pool_problem(pool_name: str, pool_slots: int, pool_size: int | None) -> str | None:
    """Why a task needing ``pool_slots`` of ``pool_name`` (``pool_size`` slots, ``None`` if absent) cannot run."""
    if pool_size is None:
        return (
            f"GPU pool {pool_name!r} does not exist, so this task would wait forever. Create it with "
            f"'airflow pools set {pool_name} <number of GPUs> \"GPUs\"', or unset [gpu] pool."
        )
    if pool_slots > pool_size:
        slots = f"{pool_slots} slot{'s' if pool_slots != 1 else ''}"
        return (
            f"This task needs {slots} of GPU pool {pool_name!r}, which has only {pool_size}, so it "
            f"would wait forever. Lower gpu_count, or resize the pool: "
            f"'airflow pools set {pool_name} {pool_slots} \"GPUs\"'."
        )
    return None


def fail_unschedulable_gpu_tasks(dag_run: Any, session: Any) -> list[str]:
    """Fail the unscheduled task instances of ``dag_run`` that wait on a missing or too-small GPU pool.

    :return: the task ids that were failed
    """
    from airflow.models.pool import Pool
    from airflow.utils.state import TaskInstanceState

    pool_name = config.get("pool")
    if not pool_name:
        return []
    pool = Pool.get_pool(pool_name, session=session)
    size = None if pool is None else (pool.slots if pool.slots >= 0 else None)
    if pool is not None and pool.slots < 0:  # -1: unlimited
        return []
    failed = []
    for ti in dag_run.get_task_instances(session=session):
        if ti.pool != pool_name or ti.state not in (None, TaskInstanceState.SCHEDULED):
            continue
        problem = pool_problem(pool_name, ti.pool_slots, size)
        if problem is None:
            continue
        log.error("Failing %s: %s", ti.key, problem)
        ti.note = problem
        ti.set_state(TaskInstanceState.FAILED, session=session)
        failed.append(ti.task_id)
    return failed


@hookimpl
def on_dag_run_running(dag_run: Any, msg: str) -> None:
    """In the scheduler, when a DAG run starts."""
    from sqlalchemy.orm import object_session

    session = object_session(dag_run)
    if session is None:
        return
    try:
        fail_unschedulable_gpu_tasks(dag_run, session)
    except Exception:  # a listener must never break the scheduler
        log.exception("Checking the GPU pool failed")
