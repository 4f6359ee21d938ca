"""The GPU pool, ``[gpu] pool``: which tasks join it with how many slots, and the scheduler's side of it.

- :func:`with_gpu_pool` (DAG parse): a task that asks for GPUs joins the pool with ``pool_slots = gpu_count``.
- :func:`takes_the_pool`: a task that asks for ``gpu_count="all"`` takes every slot of the pool, whose size only
  the metadata DB knows: sized here when a DAG run starts, and by :mod:`.pool_policy` when refreshed.
- :func:`on_starting` (a listener): when the scheduler starts, the GPU pools of ``[gpu] inventory`` are created
  or checked (:func:`.placement.pools.ensure_pools`).
- :func:`on_dag_run_running` (a listener): the scheduler only logs "Tasks using non-existent pool ... will not be
  scheduled" and leaves tasks of a missing or too-small pool waiting forever; this fails them at once, with a note
  that says why and how to fix it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow.listeners import hookimpl

from airflow_gpu_provider import config
from airflow_gpu_provider.placement.pools import ensure_pools, is_gpu_pool
from airflow_gpu_provider.settings.resources import ALL_GPUS

if TYPE_CHECKING:
    from airflow_gpu_provider.settings import ResourceSettings

log = logging.getLogger(__name__)

#: ``executor_config`` key that marks a task of ``gpu_count="all"``: the scheduler gives it the whole pool.
ALL_SLOTS_KEY = "airflow_gpu_provider_pool_slots"


def with_gpu_pool(
    resources: ResourceSettings, overrides: Mapping[str, Any], kwargs: dict[str, Any], *, pool: str | None = None
) -> dict[str, Any]:
    """``kwargs`` of a GPU task with the ``[gpu] pool`` arguments added (unless the task names its own pool).

    ``pool_slots`` is ``gpu_count``. A templated ``gpu_count`` is known only when the task runs, after the
    scheduler took the slots: it takes one. ``gpu_count="all"`` is marked in ``executor_config`` and gets every
    slot of the pool in the scheduler (:func:`takes_the_pool`).

    :param pool: the pool of this task's worker class (:func:`.placement.pools.pool_for`); default ``[gpu] pool``
    """
    pool = pool or config.get("pool")
    templated = "gpu_count" in overrides
    if "pool" in kwargs or not pool or not (resources.requests_gpus or templated):
        return kwargs
    count = resources.gpu_count
    if count == ALL_GPUS and not templated:
        executor_config = {**(kwargs.get("executor_config") or {}), ALL_SLOTS_KEY: ALL_GPUS}
        return {"pool_slots": 1, **kwargs, "pool": pool, "executor_config": executor_config}
    return {"pool_slots": count if isinstance(count, int) and not templated else 1, **kwargs, "pool": pool}


def takes_the_pool(task_instance: Any) -> bool:
    """Whether a task instance asks for all GPUs, so that it takes every slot of its pool."""
    executor_config = getattr(task_instance, "executor_config", None)
    return isinstance(executor_config, dict) and executor_config.get(ALL_SLOTS_KEY) == ALL_GPUS


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

    Airflow calls this from ``Job.__init__``, before the scheduler's runner sets ``job_type``: the command tells.
    """
    job_type = getattr(component, "job_type", None)
    scheduler = job_type == "SchedulerJob" or (job_type is None and sys.argv[1:2] == ["scheduler"])
    if not scheduler or not config.get("inventory"):
        return
    from airflow.utils.session import create_session

    try:
        with create_session() as session:
            log.info("GPU pools: %s", ensure_pools(session))
    except Exception:  # a listener must never break the scheduler
        log.exception("Creating the GPU pools of [gpu] inventory failed")
