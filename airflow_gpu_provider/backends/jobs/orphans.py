"""Jobs whose worker died: whether one is to be stopped before new work starts on this host.

A worker killed with SIGKILL cannot stop its job. Every job names its worker (:func:`.host.workers.worker_identity`:
a container's label, a Slurm job's comment), whether a later try may take it over (``durable``) and its Airflow
deployment. Before a task of this host submits its job, each backend lists its jobs and stops those
:func:`orphaned` says: at once a job of a dead worker of this host that no try takes over, and a durable one
(deferred, or left for the next try to reattach to) once its task instance has ended, as asked of its own deployment
(:func:`.host.workers.task_instance_live`). Jobs of workers on other hosts, and another deployment's durable jobs,
are left to them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from airflow_gpu_provider.host.workers import deployment, is_dead, task_instance_live

#: what a job's marks name of its task instance
IDENTITY = ("dag_id", "task_id", "run_id", "map_index")


def orphaned(marks: Mapping[str, str], log: logging.Logger, ours: str | None = None) -> str | None:
    """Why a job is to be stopped now (its worker on this host died, and no try takes it over); else ``None``.

    :param marks: what the job carries: ``worker``, ``durable`` (``"true"``), ``deployment`` and the task instance
        (:data:`IDENTITY`)
    :param ours: this worker's deployment (:func:`.host.workers.deployment`, computed when ``None``)
    """
    if not is_dead(marks.get("worker", "")):
        return None
    ours = ours or deployment()
    if marks.get("deployment", ours) != ours:
        return None  # another Airflow's is its own workers' (one without the mark, from 0.1.0, is ours)
    if marks.get("durable") != "true":
        return "left running by a worker that died"
    identity = {key: marks[key] for key in IDENTITY if key in marks}
    if task_instance_live(identity, log):
        return None  # its task instance goes on: its next try, or the deferred task's resume, takes it over
    return "whose task instance has ended; its worker died"
