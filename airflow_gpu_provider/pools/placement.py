"""The GPU pool of each worker class (``[gpu] pool``, with ``{accelerator}`` or ``{queue}``) and their sizes.

``[gpu] inventory`` (``A100=16, H100=8``; ``*`` for tasks that name no model) says how many GPUs each worker class
has; the scheduler creates the missing pools with those sizes when it starts and checks the others
(:func:`ensure_pools`). The pool listener fails the tasks that could never fit, in whichever GPU pool.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from airflow_gpu_provider import config
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.settings import ResourceSettings
from airflow_gpu_provider.settings.resources import ALL_GPUS

log = logging.getLogger(__name__)
ANY_MODEL = "*"  # in [gpu] inventory: the GPUs that tasks naming no model go to (pool gpu-any)
_NAME = "[A-Za-z0-9_.\\-]+"


def pool_for(owner: str, resources: ResourceSettings, queue: str | None) -> str | None:
    """The GPU pool a GPU task joins: ``[gpu] pool`` with its placeholders filled (``None``: no pool)."""
    template = config.get("pool")
    if not template:
        return None
    from airflow_gpu_provider.backends.executor.executors import model_slug, queue_for  # a pool per worker class

    if "{queue}" in template:
        template = template.replace("{queue}", queue or queue_for(owner, resources, config.get("queue")))
    return template.replace("{accelerator}", model_slug(owner, resources)) if "{accelerator}" in template else template


def is_gpu_pool(name: str | None, queue: str | None = None) -> bool:
    """Whether ``name`` is a GPU pool of ``[gpu] pool`` (any worker class); ``{queue}`` is ``queue`` when given."""
    template = config.get("pool")
    if not template or not name:
        return False
    queue_pattern = re.escape(queue) if queue else _NAME
    pattern = re.escape(template).replace(r"\{accelerator\}", _NAME).replace(r"\{queue\}", queue_pattern)
    return re.fullmatch(pattern, name) is not None


def inventory(text: str) -> dict[str, int]:
    """``[gpu] inventory``: accelerator model (or ``*``) -> GPUs of that worker class."""
    found: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        model, _, count = item.partition("=")
        if not model.strip() or not count.strip().isdigit():
            raise InvalidSettingError(
                "[gpu]", "inventory", text, f"{item!r} is not MODEL=COUNT", "A100=16, H100=8, *=4"
            )
        found[model.strip()] = int(count)
    return found


def sizes() -> dict[str, int]:
    """The GPU pools ``[gpu] pool`` and ``[gpu] inventory`` describe, with their sizes (summed per pool)."""
    result: dict[str, int] = {}
    if not config.get("pool"):
        return result
    for model, count in inventory(config.get("inventory")).items():
        wanted = ResourceSettings(gpu_count=1, accelerator=None if model == ANY_MODEL else model)
        name = pool_for("[gpu] inventory", wanted, None)
        if name is not None:
            result[name] = result.get(name, 0) + count
    return result


def ensure_pools(session: Any) -> dict[str, str]:
    """Create the missing GPU pools with their inventory sizes; report (never resize) those of another size.

    :return: pool name -> what was done (``created``, ``ok``, or a mismatch message)
    """
    from airflow.models.pool import Pool

    done: dict[str, str] = {}
    for name, size in sizes().items():
        pool = session.query(Pool).filter(Pool.pool == name).one_or_none()
        if pool is None:
            session.add(Pool(pool=name, slots=size, description="GPUs ([gpu] inventory)", include_deferred=False))
            done[name] = "created"
        elif pool.slots != size:
            done[name] = f"has {pool.slots} slots, [gpu] inventory says {size}: left as it is"
            log.warning("GPU pool %r %s", name, done[name])
        else:
            done[name] = "ok"
    session.commit()
    return done


#: ``executor_config`` key that marks a task of ``gpu_count="all"``: the scheduler gives it the whole pool.
ALL_SLOTS_KEY = "airflow_gpu_provider_pool_slots"


def with_gpu_pool(
    resources: ResourceSettings, overrides: Mapping[str, Any], kwargs: dict[str, Any], *, pool: str | None = None
) -> dict[str, Any]:
    """``kwargs`` of a GPU task with the ``[gpu] pool`` arguments added (unless the task names its own pool).

    ``pool_slots`` is ``gpu_count``; a share of one GPU joins no pool (the host allocator places it). A templated
    ``gpu_count`` is known only when the task runs, after the scheduler took the slots: it takes one.
    ``gpu_count="all"`` is marked in ``executor_config`` and gets every slot of the pool in the scheduler
    (:func:`takes_the_pool`).

    :param pool: the pool of this task's worker class (:func:`pool_for`); default ``[gpu] pool``
    """
    pool = pool or config.get("pool")
    templated = "gpu_count" in overrides
    if "pool" in kwargs or not pool or not (resources.requests_gpus or templated):
        return kwargs
    if resources.share is not None or "gpu_share" in overrides:  # the pool counts whole GPUs: the host places shares
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
