"""Containers that outlive their worker on purpose: recorded in the task state store, reattached by a later try.

This is Airflow 3.3's durable contract (``ResumableJobMixin``, driven by ``operators/durable.py``) on a Docker
engine. A task's container is recorded in its task instance's task state store under :data:`KEY` (:data:`RECORD`,
the job wing's record) as soon as it is created, before it starts. When the task is deferred, or its worker dies
(SIGKILL, a redeploy, a cleared task), the next try of the same task instance asks the recorded container's
:func:`status`: one that runs (:func:`is_active`) is followed, its output logged and its result collected; one that
ended with status 0 (:func:`is_succeeded`) is collected; any other (failed, never started, gone) is removed and the
task starts afresh, as ``durable=False`` always does. A try removes its container only while it owns it. The orphan
reaper spares a durable container while its task instance has not ended, and only the reapers of its own Airflow
deployment judge it (``backends/jobs/orphans.py``): another deployment sharing the engine cannot ask about it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from docker.errors import APIError

from airflow_gpu_provider.backends.jobs.durable import JobRecord
from airflow_gpu_provider.host.workers import deployment
from airflow_gpu_provider.task.labels import PROVIDER, docker_label

KEY = "airflow_gpu_provider.docker_container"
_IDENTITY = ("dag_id", "task_id", "run_id", "map_index")
#: the label naming the Airflow deployment whose task instance a durable container belongs to
DEPLOYMENT_LABEL = docker_label("deployment")
#: the engine's states of a container that still runs: a later try follows it
ACTIVE = ("running", "restarting", "paused")


def _container_id(value: str) -> bool:
    return len(value) == 64 and all(c in "0123456789abcdef" for c in value)


#: the container's record in the task state store (the job wing's: ``backends/jobs/durable.py``)
RECORD = JobRecord(KEY, "container", "engine", valid_id=_container_id)


def recorded(state_store: Any, engine: str) -> str | None:
    """The id of the container an earlier try of this task instance recorded on this engine, or ``None``."""
    return (RECORD.recorded(state_store, engine) or {}).get("id")


def recorded_id(value: Any, engine: str) -> str | None:
    """The container id of a record of this engine; ``None`` for anything else."""
    return (RECORD.checked(value, engine) or {}).get("id")


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
    if own.get(PROVIDER) != "true" or own.get(DEPLOYMENT_LABEL) != deployment():
        return False
    return identity is None or all(own.get(docker_label(key)) == str(identity.get(key)) for key in _IDENTITY)
