"""The Docker engine's client: docker-py's ``APIClient``, from Airflow's ``DockerHook``."""

from __future__ import annotations

from typing import Any

from airflow.providers.docker.hooks.docker import DockerHook

from airflow_gpu_provider.backends.docker.options import DockerOptions
from airflow_gpu_provider.backends.docker.plan import Engine
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


def read_engine(conn_id: str | None) -> Engine:
    """The engine's facts: the extras of its Docker connection (``conn_id``, else ``docker_default``; none: none).

    Each checked (an error names the connection, the extra, the value and the accepted forms). Unset, a removed
    ``[gpu]`` option still gives it for one release (warning), else the default. Read on the worker, never at parse.
    """
    from airflow.exceptions import AirflowNotFoundException

    from airflow_gpu_provider.backends.base import connection_extra
    from airflow_gpu_provider.settings.grammar import IMAGE_REFERENCE
    from airflow_gpu_provider.settings.image import IMAGE_FORMS, check_image_reference
    from airflow_gpu_provider.settings.units import parse_bytes

    name = conn_id or DockerHook.default_conn_name
    try:
        extras = DockerHook.get_connection(name).extra_dejson
    except AirflowNotFoundException:
        extras = {}
    owner = f"the Docker connection {name!r}"

    def registry(value: str) -> None:
        if "://" in value or not IMAGE_REFERENCE.fullmatch(value):
            raise ValueError("not a registry host and namespace")

    def absolute(value: str) -> None:
        if not value.startswith("/"):
            raise ValueError("not an absolute path")

    default = Engine()
    return Engine(
        connection_extra(owner, extras, "image_registry", "image_registry", check=registry,
                         accepted="a registry host and namespace, e.g. 'registry.example.com/ml'") or default.registry,
        connection_extra(owner, extras, "ca_bundle", "ca_bundle", check=absolute,
                         accepted="an absolute path of a PEM file on the worker") or default.ca_bundle,
        connection_extra(owner, extras, "parent_image", "default_parent_image", check=check_image_reference,
                         accepted=IMAGE_FORMS) or default.parent_image,
        connection_extra(owner, extras, "shm_size", "shm_size", check=parse_bytes,
                         accepted="an amount of bytes such as 16Gi") or default.shm_size,
    )  # fmt: skip
