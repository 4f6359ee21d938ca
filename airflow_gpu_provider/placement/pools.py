"""The GPU pool of each worker class (``[gpu] pool``, with ``{accelerator}`` or ``{queue}``) and their sizes.

``[gpu] inventory`` (``A100=16, H100=8``; ``*`` for tasks that name no model) says how many GPUs each worker class
has; the scheduler creates the missing pools with those sizes when it starts and checks the others
(:func:`ensure_pools`). The pool listener fails the tasks that could never fit, in whichever GPU pool.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from airflow_gpu_provider import config
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.placement.executors import model_slug, queue_for
from airflow_gpu_provider.settings import ResourceSettings

log = logging.getLogger(__name__)
ANY_MODEL = "*"  # in [gpu] inventory: the GPUs that tasks naming no model go to (pool gpu-any)
_NAME = "[A-Za-z0-9_.\\-]+"


def pool_for(owner: str, resources: ResourceSettings, queue: str | None) -> str | None:
    """The GPU pool a GPU task joins: ``[gpu] pool`` with its placeholders filled (``None``: no pool)."""
    template = config.get("pool")
    if not template:
        return None
    if "{queue}" in template:
        template = template.replace("{queue}", queue or queue_for(owner, resources, config.get("queue")))
    return template.replace("{accelerator}", model_slug(resources))


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
