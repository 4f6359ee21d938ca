"""Backends, found by name: each translates a TaskRequest into its own spec (``plan``) and runs it (``run``).

Backends are imported lazily, so DAG parsing never loads docker-py or the kubernetes client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from airflow_gpu_provider.exceptions import MissingDependencyError

if TYPE_CHECKING:
    from airflow_gpu_provider.backends.base import Backend

# name -> (class path, pip extra that provides its dependencies)
BACKENDS: dict[str, tuple[str, str | None]] = {
    "local": ("airflow_gpu_provider.backends.local.LocalBackend", None),
    "docker": ("airflow_gpu_provider.backends.docker.DockerBackend", "docker"),
    "kubernetes": ("airflow_gpu_provider.backends.kubernetes.KubernetesBackend", "kubernetes"),
}


def get_backend_class(name: str) -> type[Backend[Any]]:
    """Import a backend by name, naming the pip extra when its dependencies are missing."""
    path, extra = BACKENDS[name]
    module_name, class_name = path.rsplit(".", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        if extra is None:
            raise
        raise MissingDependencyError(f"The {name!r} backend ({err.name})", extra) from err
    return getattr(module, class_name)
