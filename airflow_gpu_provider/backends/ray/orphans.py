"""Jobs whose worker died: found by the worker named in their metadata, stopped before new work starts.

A worker killed with SIGKILL cannot stop its job. Every job's metadata names its worker
(:func:`.host.workers.worker_identity`) and whether a later try may take it over (``durable``); before a Ray task
of this host submits its job, the running jobs of this host's dead workers that no try will take over
(``durable=False``) are stopped and deleted. A durable job is left to the next try of its task instance
(``durable.py``), which reattaches to it; jobs of workers on other hosts are left to them.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_gpu_provider.backends.ray import job
from airflow_gpu_provider.host.workers import is_dead


def reap_orphans(client: Any, log: logging.Logger) -> list[str]:
    """Stop and delete the jobs of this host's dead workers that no later try takes over; return their ids."""
    reaped = []
    for found in client.list_jobs():
        metadata = found.metadata or {}
        if metadata.get("airflow_gpu_provider") != "true" or metadata.get("durable") == "true":
            continue
        if str(found.status) in job.TERMINAL or not is_dead(metadata.get("worker", "")):
            continue
        job.stop(client, found.submission_id)
        job.delete(client, found.submission_id, log)
        reaped.append(found.submission_id)
        log.warning(
            "Stopped Ray job %s, left running by a worker that died (%s)",
            found.submission_id,
            metadata["worker"],
        )
    return reaped
