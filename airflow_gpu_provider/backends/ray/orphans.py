"""Jobs whose worker died: found by the worker named in their metadata, stopped before new work starts.

A worker killed with SIGKILL cannot stop its job. Every job's metadata names its worker
(:func:`.host.workers.worker_identity`), whether a later try may take it over (``durable``) and its Airflow
deployment; before a Ray task of this host submits its job, the running jobs of this host's dead workers are stopped
and deleted: at once when no try will take them over (``durable=False``), and a durable one (deferred, or left for
the next try to reattach to: ``durable.py``) once its task instance has ended (marked failed or success while its
worker was dead, its tries spent), as asked of its own deployment (:func:`.host.workers.task_instance_live`). Jobs of
workers on other hosts, and another deployment's durable jobs, are left to them.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow_gpu_provider.backends.ray import job
from airflow_gpu_provider.host.workers import deployment, is_dead, task_instance_live


def reap_orphans(client: Any, log: logging.Logger) -> list[str]:
    """Stop and delete the jobs of this host's dead workers that no later try takes over; return their ids."""
    reaped, ours = [], None
    for found in client.list_jobs():
        metadata = found.metadata or {}
        if metadata.get("airflow_gpu_provider") != "true" or str(found.status) in job.TERMINAL:
            continue
        if not is_dead(metadata.get("worker", "")):
            continue
        why = "left running by a worker that died"
        if metadata.get("durable") == "true":
            ours = ours or deployment()
            if metadata.get("deployment", ours) != ours or task_instance_live(metadata, log):
                continue  # its task instance goes on: its next try, or the deferred task's resume, takes it over
            why = "whose task instance has ended; its worker died"
        job.stop(client, found.submission_id)
        job.delete(client, found.submission_id, log)
        reaped.append(found.submission_id)
        log.warning("Stopped Ray job %s, %s (%s)", found.submission_id, why, metadata["worker"])
    return reaped
