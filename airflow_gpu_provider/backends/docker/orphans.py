"""Containers whose worker died: found by a label naming the worker process, removed before new work starts.

A worker killed with SIGKILL cannot remove its container, and its GPU locks are freed with it while the container
may still be using the GPUs. Every container is labelled with its worker (:func:`.host.workers.worker_identity`)
and its Airflow deployment; before a task takes GPUs on this host, the containers of this deployment's dead workers
of this host are removed: those that still run, and the ended ones that their ``auto_remove`` policy would have
removed (a container kept for inspection stays). Containers of workers on other hosts (sharing a remote engine) or
of another deployment are left to them (the authorization plugin would refuse it anyway). A durable container
(deferred, or left for a later try to reattach to: ``durable.py``) is spared while its task instance has not ended.
Then the files folders of lasting containers that are gone (``files.sweep``).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from docker.errors import APIError, NotFound

from airflow_gpu_provider.backends.docker.files import sweep
from airflow_gpu_provider.backends.jobs.orphans import IDENTITY, orphaned
from airflow_gpu_provider.host.workers import deployment
from airflow_gpu_provider.task.labels import docker_label

WORKER_LABEL = docker_label("worker")
AUTO_REMOVE_LABEL = docker_label("auto-remove")
DURABLE_LABEL = docker_label("durable")
_ENDED = ("exited", "dead")
#: the labels that carry what the job wing's orphan rule reads (``jobs/orphans.py``)
_MARKS = {name: docker_label(name) for name in ("worker", "durable", "deployment", *IDENTITY)}


def reap_orphans(client: Any, state_dir: str, log: logging.Logger) -> list[str]:
    """Remove the containers of this host's dead workers, then the files of lasting ones that are gone; their ids."""
    reaped, ours = [], deployment()
    containers = client.containers(all=True, filters={"label": WORKER_LABEL})
    for container in containers:
        labels = container["Labels"]
        kept = container.get("State") in _ENDED and labels.get(AUTO_REMOVE_LABEL) in ("never", "success")
        marks = {name: labels[label] for name, label in _MARKS.items() if label in labels}
        if kept or orphaned(marks, log, ours) is None:
            continue
        with contextlib.suppress(NotFound, APIError):
            client.remove_container(container["Id"], force=True)
            reaped.append(container["Id"])
            log.warning(
                "Removed container %s, left %s by a worker that died (%s)",
                container["Id"][:12],
                "behind" if container.get("State") in _ENDED else "running",
                labels[WORKER_LABEL],
            )
    sweep([c for c in containers if c["Id"] not in reaped], state_dir)
    return reaped
