"""The provider's cluster policy (the ``airflow.policy`` entry point): ``gpu_count="all"`` takes the GPU pool.

Pluggy loads this module while Airflow initialises, so it imports nothing of the provider at the top.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow import policies

log = logging.getLogger(__name__)


@policies.hookimpl
def task_instance_mutation_hook(task_instance: Any, dag_run: Any) -> None:
    """In the scheduler, when a task instance is refreshed (mapped, cleared): ``gpu_count="all"`` takes the pool.

    The scheduler's own session is used, as the hook must neither open a session nor commit. Task instances
    created with a DAG run are sized by :func:`.gpu_pool.fail_unschedulable_gpu_tasks` when the run starts
    (Airflow skips the hook there unless an ``airflow_local_settings`` module exists).
    """
    from airflow_gpu_provider.pools.placement import takes_the_pool

    if not takes_the_pool(task_instance) or dag_run is None:
        return
    from airflow.models.pool import Pool
    from sqlalchemy import select
    from sqlalchemy.orm import object_session

    session = object_session(dag_run)
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
