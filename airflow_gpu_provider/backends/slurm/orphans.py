"""Slurm jobs whose worker died: their comment names the worker; cancelled before a task of this host submits.

Once such a job has ended, its folder on the shared folder goes too: the folder of the batch script Slurm kept for
it, when that is one of this worker's job folders (``job.own_folder``); a cancelled job is given
:data:`ENDING_S` to end first, else its folder is left to the next task's look.

Every job's comment (``--comment``, JSON: :func:`comment`) names its task instance, its worker, whether a later try
may take it over and its Airflow deployment; :func:`marks` reads it back (a comment of another form is not the
provider's). The job wing's rule (``jobs/orphans.py``) says which to stop: a dead worker's job at once, a durable one
once its task instance has ended. Jobs of workers on other hosts are left to them.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from airflow_gpu_provider.backends.jobs.orphans import IDENTITY as TASK_INSTANCE
from airflow_gpu_provider.backends.jobs.orphans import orphaned
from airflow_gpu_provider.backends.slurm import job
from airflow_gpu_provider.backends.slurm.plan import IDENTITY
from airflow_gpu_provider.host.workers import deployment, worker_identity

MARK = "airflow_gpu_provider"
ENDING_S = 10.0


def comment(labels: Mapping[str, str], *, durable: bool) -> str:
    """The job's comment: its task instance, worker, durability and deployment (JSON)."""
    marks = {MARK: "true", **{key: str(labels.get(key, "")) for key in IDENTITY}}
    marks.update(worker=worker_identity(), durable=str(durable).lower(), deployment=deployment())
    return json.dumps(marks, separators=(",", ":"))


def marks(text: str) -> dict[str, str] | None:
    """What a job's comment says, when it is the provider's; else ``None``."""
    try:
        found = json.loads(text)
    except ValueError:
        return None
    if not isinstance(found, dict) or found.get(MARK) != "true":
        return None
    return {str(key): str(value) for key, value in found.items()}


def mine(text: str, labels: Mapping[str, Any] | None) -> bool:
    """Whether a job's comment names this deployment and this task instance (``labels``; ``None``: any of its tasks).

    A record or a trigger row is data the task's own code can write: the job is checked too, and another task's or
    another deployment's job (its task instance of the same name) is never taken, watched or cancelled.
    """
    found = marks(text)
    if found is None or found.get("deployment") != deployment():
        return False
    return labels is None or all(found.get(key) == str(labels.get(key, "")) for key in TASK_INSTANCE)  # any try


def reap_orphans(client: Any, shared_dir: str, log: logging.Logger) -> list[str]:
    """Cancel this host's dead workers' jobs that no later try takes over; remove their folders once ended.

    :return: the ids of the jobs cancelled
    """
    reaped, ours = [], deployment()
    for info in client.jobs().values():
        found = marks(info.comment)
        folder = _folder(shared_dir, info)
        if found is None or (not info.active and folder is None):
            continue  # not the provider's, or ended with nothing left of it
        why = orphaned(found, log, ours)
        if why is None:
            continue
        if info.active:
            client.cancel(info.job_id)
            reaped.append(info.job_id)
            log.warning("Cancelled Slurm job %s, %s (%s)", info.job_id, why, found["worker"])
            if not _ended(client, info.job_id):
                continue
        if folder is not None:
            job.remove_folder(folder)
    return reaped


def _folder(shared_dir: str, info: Any) -> str | None:
    return job.own_folder(shared_dir, os.path.dirname(info.script)) if info.script else None


def _ended(client: Any, job_id: str) -> bool:
    deadline = time.monotonic() + ENDING_S
    while (info := client.job(job_id)) is not None and info.active:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True
