"""The GPU pool, ``[gpu] pool``: which tasks join it with how many slots, and the scheduler's side of it.

- At DAG parse (:func:`.placement.pools.with_gpu_pool`) a task that asks for GPUs joins the pool with
  ``pool_slots = gpu_count``; a task of ``gpu_count="all"`` (:func:`.placement.pools.takes_the_pool`) takes every
  slot of the pool, whose size only the metadata DB knows: sized here when a DAG run starts, and by
  :mod:`.pool_policy` when refreshed.
- :func:`on_starting` (a listener): when the scheduler starts, the GPU pools of ``[gpu] inventory`` are created
  or checked (:func:`.placement.pools.ensure_pools`).
- :func:`on_dag_run_running` (a listener): the scheduler only logs "Tasks using non-existent pool ... will not be
  scheduled" and leaves tasks of a missing or too-small pool waiting forever; this fails them at once, with a note
  that says why and how to fix it.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from airflow.listeners import hookimpl

from airflow_gpu_provider import config
from airflow_gpu_provider.pools.placement import ensure_pools, is_gpu_pool, takes_the_pool

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

    Those of ``gpu_count="all"`` are given every slot of the pool first.

    :return: the task ids that were failed
    """
    from airflow.models.pool import Pool
    from airflow.utils.state import TaskInstanceState

    failed = []
    sizes: dict[str, int | None] = {}
    for ti in dag_run.get_task_instances(session=session):
        if not is_gpu_pool(ti.pool, ti.queue) or ti.state not in (None, TaskInstanceState.SCHEDULED):
            continue
        if ti.pool not in sizes:
            pool = Pool.get_pool(ti.pool, session=session)
            sizes[ti.pool] = None if pool is None else pool.slots
        size = sizes[ti.pool]
        if size is not None and size < 0:  # -1: unlimited
            continue
        if size and takes_the_pool(ti):
            ti.pool_slots = size
        problem = pool_problem(ti.pool, ti.pool_slots, size)
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


@hookimpl
def on_starting(component: Any) -> None:
    """When a job starts: in the scheduler, create or check the GPU pools of ``[gpu] inventory``.

    Airflow calls this from ``Job.__init__``, before the scheduler's runner sets ``job_type``: the command tells. A
    task process forked by the scheduler's LocalExecutor has the scheduler's command too, but its component is no
    job (Airflow's ``TaskRunnerMarker``): it has no database to create pools in.
    """
    if not hasattr(component, "job_type"):
        return
    job_type = component.job_type
    scheduler = job_type == "SchedulerJob" or (job_type is None and sys.argv[1:2] == ["scheduler"])
    if not scheduler or not config.get("inventory"):
        return
    from airflow.utils.session import create_session

    try:
        with create_session() as session:
            log.info("GPU pools: %s", ensure_pools(session))
    except Exception:  # a listener must never break the scheduler
        log.exception("Creating the GPU pools of [gpu] inventory failed")
