"""The provider's cluster policy (the ``airflow.policy`` entry point): ``gpu_count="all"`` takes the GPU pool.

Pluggy loads this module while Airflow initialises, so it imports nothing of the provider at the top.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from airflow import policies

log = logging.getLogger(__name__)


def _take_the_pool(task_instance: Any, dag_run: Any) -> None:
    """In the scheduler, when a task instance is refreshed (mapped, cleared): ``gpu_count="all"`` takes the pool.

    The scheduler's own session is used, as the hook must neither open a session nor commit. Task instances
    created with a DAG run are sized by :func:`.gpu_pool.fail_unschedulable_gpu_tasks` when the run starts
    (Airflow skips the hook there unless an ``airflow_local_settings`` module exists).
    """
    from airflow_gpu_provider.pools.placement import takes_the_pool

    if not takes_the_pool(task_instance):
        return
    from airflow.models.pool import Pool
    from sqlalchemy import select
    from sqlalchemy.orm import object_session

    session = object_session(dag_run if dag_run is not None else task_instance)
    if session is None:
        return
    try:
        with session.no_autoflush:
            slots = session.scalar(select(Pool.slots).where(Pool.pool == task_instance.pool))
    except Exception:  # a policy must never break the scheduler
        log.exception("Reading the size of pool %r failed", task_instance.pool)
        return
    if slots is not None and slots > 0:
        task_instance.pool_slots = slots


# Pluggy refuses a hook implementation that takes an argument its specification lacks, and that failure stops every
# Airflow command: Airflow 3.3 passes the DAG run, earlier versions only the task instance.
if "dag_run" in inspect.signature(policies.task_instance_mutation_hook).parameters:

    @policies.hookimpl
    def task_instance_mutation_hook(task_instance: Any, dag_run: Any) -> None:
        """Airflow 3.3 and later: see :func:`_take_the_pool`."""
        _take_the_pool(task_instance, dag_run)

else:

    @policies.hookimpl
    def task_instance_mutation_hook(task_instance: Any) -> None:  # type: ignore[misc]
        """Before Airflow 3.3: the task instance's own session (:func:`_take_the_pool`)."""
        _take_the_pool(task_instance, None)
