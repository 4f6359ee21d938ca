"""Jobs that outlive their worker on purpose: the submission id in the task state store, taken over by a later try.

A Ray task's job is recorded in its task instance's task state store (Airflow 3.3, AIP-103) before it is submitted
(:data:`RECORD`, the job wing's record; a try stops its job only while it owns it).
When the task is deferred, or its worker dies, the next try of the same task instance finds the record and takes
the job over (``TaskRequest.durable``): it follows the job's log and collects its result instead of submitting a
second copy; ``durable=False`` stops it and starts afresh. The job's metadata names its task instance and its
Airflow deployment: a record that points at another task's job, or at another deployment's (two deployments that
share a cluster run the same DAGs), is never followed nor stopped (:func:`mine`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_gpu_provider.backends.jobs.durable import JobRecord
from airflow_gpu_provider.backends.ray.plan import IDENTITY

KEY = "airflow_gpu_provider.ray_job"
#: the job's record in the task state store (the job wing's, ``backends/jobs/durable.py``): ``{id, cluster, try}``
RECORD = JobRecord(KEY, "Ray job", "cluster")


def cluster_of(options: Any) -> str:
    """Which cluster a record is about: the connection's id or the address the task named."""
    return str(options.ray_conn_id or options.address or "(default)")


def identity_of(task_instance: Any) -> dict[str, str]:
    """A task instance's identity (a trigger's, the listener's) as a job's metadata names it (``plan.IDENTITY``)."""
    return {key: str(getattr(task_instance, key, "")) for key in IDENTITY}


def mine(metadata: Mapping[str, str] | None, labels: Mapping[str, str], deployment: str | None = None) -> bool:
    """Whether a job's metadata names this task instance of this deployment.

    A record, a trigger's arguments or a deferral's state are data a try wrote: the job itself is checked before it
    is followed or stopped.

    :param deployment: this deployment (:func:`~airflow_gpu_provider.host.workers.deployment`), read when ``None``
    """
    from airflow_gpu_provider.host.workers import deployment as this_deployment

    metadata = metadata or {}
    same = all(str(metadata.get(key, "")) == str(labels.get(key, "")) for key in IDENTITY)
    ours = metadata.get("deployment") == (deployment if deployment is not None else this_deployment())
    return metadata.get("airflow_gpu_provider") == "true" and same and ours
