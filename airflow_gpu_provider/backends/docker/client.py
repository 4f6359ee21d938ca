"""The Docker engine's client: docker-py's ``APIClient``, from Airflow's ``DockerHook``."""

from __future__ import annotations

from typing import Any

from airflow.providers.docker.hooks.docker import DockerHook

from airflow_gpu_provider.backends.docker.options import DockerOptions
from airflow_gpu_provider.exceptions import GpuTaskError


def connect(options: DockerOptions) -> Any:
    """A docker-py ``APIClient`` from ``DockerHook`` (which pings the engine and logs in to the registry)."""
    tls = None
    if options.tls_ca_cert or options.tls_client_cert or options.tls_client_key:
        tls = DockerHook.construct_tls_config(
            ca_cert=options.tls_ca_cert, client_cert=options.tls_client_cert, client_key=options.tls_client_key
        )
    try:
        return DockerHook(
            docker_conn_id=options.docker_conn_id,
            base_url=url if isinstance(url := options.engine_url, str) else list(url),
            version=options.api_version,
            timeout=int(options.timeout),
            **({"tls": tls} if tls is not None else {}),
        ).api_client
    except Exception as err:  # noqa: BLE001 - AirflowException, DockerException, requests errors
        raise GpuTaskError(
            f"Cannot reach the Docker engine at {options.engine_url}: {err}. Start the Docker daemon on the "
            "worker, or point backend_options docker_url (or DOCKER_HOST) at a running engine."
        ) from None
