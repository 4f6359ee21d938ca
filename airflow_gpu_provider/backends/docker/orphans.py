"""Containers whose worker died: found by a label naming the worker process, removed before new work starts.

A worker killed with SIGKILL cannot remove its container, and its GPU locks are freed with it while the container
may still be using the GPUs. Every container is labelled with its worker (:func:`.host.workers.worker_identity`);
before a task takes GPUs on this host, the containers of dead workers of this host are removed. Containers of
workers on other hosts (sharing a remote engine) are left to them.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from docker.errors import APIError, NotFound

from airflow_gpu_provider.host.workers import is_dead

WORKER_LABEL = "airflow-gpu-provider.worker"


def reap_orphans(client: Any, log: logging.Logger) -> list[str]:
    """Remove the containers of this host's dead workers; return their ids."""
    reaped = []
    for container in client.containers(all=True, filters={"label": WORKER_LABEL}):
        if is_dead(container["Labels"].get(WORKER_LABEL, "")):
            with contextlib.suppress(NotFound, APIError):
                client.remove_container(container["Id"], force=True)
                reaped.append(container["Id"])
                log.warning(
                    "Removed container %s, left running by a worker that died (%s)",
                    container["Id"][:12],
                    container["Labels"][WORKER_LABEL],
                )
    return reaped
