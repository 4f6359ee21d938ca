"""Jobs whose worker died: found by the worker named in their metadata, stopped before new work starts.

Every job's metadata names its worker, whether a later try may take it over (``durable``), its Airflow deployment
and its task instance (``job.submit``): the marks the job wing's rule reads (``backends/jobs/orphans.py``). Before a
Ray task of this host submits its job, the running jobs that rule calls orphaned are stopped and deleted: a dead
worker's at once, a durable one once its task instance has ended.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_gpu_provider.backends.jobs.orphans import orphaned
from airflow_gpu_provider.backends.ray import job


def reap_orphans(client: Any, log: logging.Logger) -> list[str]:
    """Stop and delete the jobs of this host's dead workers that no later try takes over; return their ids."""
    reaped = []
    for found in client.list_jobs():
        metadata = {str(k): str(v) for k, v in (found.metadata or {}).items()}
        if metadata.get("airflow_gpu_provider") != "true" or str(found.status) in job.TERMINAL:
            continue
        why = orphaned(metadata, log)
        if why is None:
            continue
        job.stop(client, found.submission_id)
        job.delete(client, found.submission_id, log)
        reaped.append(found.submission_id)
        log.warning("Stopped Ray job %s, %s (%s)", found.submission_id, why, metadata["worker"])
    return reaped
