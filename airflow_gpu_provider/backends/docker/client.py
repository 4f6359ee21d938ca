"""The Docker engine's client: docker-py's ``APIClient``, from Airflow's ``DockerHook``."""

from __future__ import annotations

from typing import Any

from airflow.providers.docker.hooks.docker import DockerHook

from airflow_gpu_provider.backends.docker.options import DockerOptions
from airflow_gpu_provider.exceptions import GpuTaskError


def connect(options: DockerOptions, *, login: bool = True) -> Any:
    """A docker-py ``APIClient`` from ``DockerHook``, which pings the engine (and logs in to a registry).

    The engine must be this process's default one or one of ``[gpu_policy] allowed_clusters`` (``policy/docker.py``),
    checked here with this process's own ``[gpu]`` section: the worker's, or the triggerer's. TLS to a remote engine
    comes from this process's environment (``DOCKER_CERT_PATH``, ``DOCKER_TLS_VERIFY``, as the docker CLI reads
    them), never from a path in a DAG.

    :param login: log in to the registry (pulls and pushes); a trigger, which only watches a container, does not
    :raises PolicyError: for an engine the deployment does not list
    """
    from docker.utils import kwargs_from_env

    from airflow_gpu_provider.policy import Policy
    from airflow_gpu_provider.policy.docker import check_engine

    check_engine("the task's Docker engine", options.engines, options.default_engine, Policy.current())
    remote = any(not url.startswith("unix://") for url in options.engines)
    tls = kwargs_from_env().get("tls") if remote else None
    try:
        return DockerHook(
            docker_conn_id=options.docker_conn_id if login else None,
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


def connection_extra(conn_id: str | None, name: str, old_option: str) -> str:
    """An engine fact from the Docker connection's extras (``conn_id``, else ``docker_default``; none: no extras).

    Else the removed ``[gpu] <old_option>``, read for one more release with a warning naming the connection field.
    """
    from airflow.exceptions import AirflowNotFoundException

    from airflow_gpu_provider import config

    try:
        extras = DockerHook.get_connection(conn_id or DockerHook.default_conn_name).extra_dejson
    except AirflowNotFoundException:
        extras = {}
    return str(extras.get(name) or config.deprecated(old_option) or "")
