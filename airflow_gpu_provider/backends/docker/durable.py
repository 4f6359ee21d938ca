"""Containers that outlive their worker on purpose: recorded in the task state store, reattached by a later try.

This is Airflow 3.3's durable contract (``ResumableJobMixin``, driven by ``operators/durable.py``) on a Docker
engine. A task's container is recorded in its task instance's task state store (AIP-103) under :data:`KEY` as soon as
it is created, before it starts (:func:`record`). When the task is deferred, or its worker dies (SIGKILL, a redeploy,
a cleared task), the next try of the same task instance asks the recorded container's :func:`status`: one that runs
(:func:`is_active`) is followed, its output logged and its result collected; one that ended with status 0
(:func:`is_succeeded`) is collected; any other (failed, never started, gone) is removed and the task starts afresh,
as ``durable=False`` always does. A try removes its container only while it :func:`owns` it. The orphan reaper spares
a durable container while its task instance has not ended (:func:`task_instance_live`), and only the reapers of its
own Airflow deployment judge it (:func:`.host.workers.deployment`): another deployment sharing the engine cannot
ask about it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from docker.errors import APIError

from airflow_gpu_provider.host import workers
from airflow_gpu_provider.task.labels import PROVIDER, docker_label

KEY = "airflow_gpu_provider.docker_container"
_IDENTITY = ("dag_id", "task_id", "run_id", "map_index")
#: the label naming the Airflow deployment whose task instance a durable container belongs to
DEPLOYMENT_LABEL = docker_label("deployment")
#: the engine's states of a container that still runs: a later try follows it
ACTIVE = ("running", "restarting", "paused")


def entry(container_id: str, engine: str, try_number: str) -> dict[str, Any]:
    """What the task state store keeps of a container: its id, its engine and the try that follows it."""
    return {"id": container_id, "engine": engine, "try": try_number}


def record(state_store: Any, container_id: str, engine: str, try_number: str) -> None:
    """Keep the container of this try for the next one (nothing without a task state store)."""
    if state_store is not None:
        state_store.set(KEY, entry(container_id, engine, try_number))


def owns(state_store: Any, container_id: str, try_number: str, log: logging.Logger) -> bool:
    """Whether this try may still remove its container: no later try took it over (:func:`record` again).

    A try whose worker was killed can live on (Airflow's task process leads a process group of its own, which a
    worker's ``killpg`` misses) and reach its clean-up while a later try follows the same container. Without an
    answer from the store (its supervisor died with the worker) it is not removed on a guess: the orphan reaper
    removes it once its task instance has ended.
    """
    if state_store is None:
        return True
    try:
        value = state_store.get(KEY, default=None)
    except Exception as err:  # noqa: BLE001 - the store is out of reach: this try's supervisor is gone
        log.warning("Cannot tell whether a later try took container %s over (%s): it is kept.", container_id[:12], err)
        return False
    if isinstance(value, dict) and value.get("id") == container_id and value.get("try") != try_number:
        log.warning(
            "Container %s was taken over by try %s of this task: it is left to that try.",
            container_id[:12],
            value.get("try"),
        )
        return False
    return True


def forget(state_store: Any) -> None:
    """The container was removed: nothing to reattach to."""
    if state_store is not None:
        state_store.delete(KEY)


def recorded(state_store: Any, engine: str) -> str | None:
    """The id of the container an earlier try of this task instance recorded on this engine, or ``None``."""
    return None if state_store is None else recorded_id(state_store.get(KEY, default=None), engine)


def recorded_id(value: Any, engine: str) -> str | None:
    """The container id of a record (:func:`entry`) of this engine; ``None`` for anything else."""
    if not isinstance(value, dict) or value.get("engine") != engine:
        return None
    container_id = value.get("id")
    if not isinstance(container_id, str) or len(container_id) != 64:
        return None
    return container_id if all(c in "0123456789abcdef" for c in container_id) else None


def status(found: Mapping[str, Any] | None) -> str:
    """A recorded container's state in the engine's words: ``running``, ``exited 0``, ``exited 137``, ``created``...

    ``missing`` when it is gone or is not this task instance's (:func:`find` found nothing).
    """
    if found is None:
        return "missing"
    state = found.get("State") or {}
    name = str(state.get("Status") or "unknown")
    return f"{name} {state.get('ExitCode')}" if name in ("exited", "dead") else name


def is_active(state: str) -> bool:
    """The container still runs: a later try follows it instead of starting another."""
    return state in ACTIVE


def is_succeeded(state: str) -> bool:
    """The container ended with status 0: a later try collects its result."""
    return state == "exited 0"


def find(client: Any, container_id: str, labels: Mapping[str, str]) -> dict[str, Any] | None:
    """The recorded container, when it still exists and is this task instance's (:func:`belongs`), else ``None``.

    A record is data the task's own code can write, so the container is checked: another task's, or another
    deployment's (its task instance of the same name), is never taken; nor one the engine will not show.
    """
    try:
        found = client.inspect_container(container_id)
    except APIError as err:  # gone (404), or not the deployment's to reach (403, the authorization plugin)
        if getattr(err, "status_code", None) in (403, 404):
            return None
        raise
    return dict(found) if belongs(found, labels) else None


def belongs(found: Mapping[str, Any], identity: Mapping[str, Any] | None) -> bool:
    """Whether a container (its inspect) is the provider's, this deployment's, and the task instance's.

    :param identity: ``dag_id``, ``task_id``, ``run_id``, ``map_index``; ``None``: any task's of the deployment
    """
    own = (found.get("Config") or {}).get("Labels") or {}
    if own.get(PROVIDER) != "true" or own.get(DEPLOYMENT_LABEL) != workers.deployment():
        return False
    return identity is None or all(own.get(docker_label(key)) == str(identity.get(key)) for key in _IDENTITY)


def task_instance_live(labels: Mapping[str, str], log: logging.Logger) -> bool:
    """Whether the task instance a container's labels name has not ended (:func:`.host.workers.task_instance_live`)."""
    return workers.task_instance_live({k: labels[docker_label(k)] for k in _IDENTITY if docker_label(k) in labels}, log)
