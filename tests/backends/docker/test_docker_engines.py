"""The Docker engine a task reaches comes from the admin's list, on the worker and in the triggerer.

Low item of issue 27: a deferred Docker task's trigger connected from the triggerer to any ``docker_url`` the author
named, logged in there with any named connection, and read the TLS files the author named. Now the engine is the
worker's default one (``$DOCKER_HOST`` or the local socket) or one of ``[gpu_policy] allowed_clusters``, checked at
parse, on the worker and again in the triggerer; the trigger logs in nowhere, and TLS comes from the worker's and
triggerer's own ``DOCKER_CERT_PATH``, never from a path in the DAG.
"""

from __future__ import annotations

import asyncio

import pytest

from airflow_gpu_provider import GpuStepOperator
from airflow_gpu_provider.backends.docker.options import DockerOptions
from airflow_gpu_provider.backends.docker.trigger import DockerContainerTrigger
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.policy import PolicyError

EVIL = "tcp://203.0.113.7:2375"  # TEST-NET-3: nothing answers there


def docker_task(**options) -> GpuStepOperator:
    return GpuStepOperator(task_id="t", command=["true"], backend="docker", backend_options=options)


async def first_event(trigger: DockerContainerTrigger) -> dict:
    async for event in trigger.run():
        return event.payload
    raise AssertionError("no event")


def test_an_engine_the_admin_does_not_list_is_refused_at_parse(monkeypatch):
    with pytest.raises(PolicyError, match=r"backend_options\['docker_url'\]='tcp://.*allowed_clusters"):
        docker_task(docker_url=EVIL)
    with pytest.raises(PolicyError, match="allowed_clusters"):
        docker_task(docker_url=[DockerOptions().engine_url, EVIL])  # every engine of a list
    docker_task(docker_url=DockerOptions().engine_url)  # the worker's own default needs no listing
    monkeypatch.setenv(
        "AIRFLOW__GPU_POLICY__ALLOWED_CLUSTERS", "docker=tcp://gpu-host:2376, docker=unix:///run/user/1000/docker.sock"
    )
    docker_task(docker_url="TCP://GPU-HOST:2376/")
    docker_task(docker_url="unix://run/user/1000/docker.sock")


@pytest.mark.parametrize("name", ["tls_ca_cert", "tls_client_cert", "tls_client_key"])
def test_tls_files_are_the_workers_never_a_path_in_the_dag(name):
    with pytest.raises(InvalidSettingError, match=rf"'{name}'.*DOCKER_CERT_PATH"):
        docker_task(**{name: "/etc/ssl/private/host.key"})


def test_the_trigger_reaches_no_engine_the_triggerers_section_does_not_list(monkeypatch):
    """A trigger row is JSON in the metadata database: the triggerer checks it again, with its own [gpu]."""
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_CLUSTERS", "")
    trigger = DockerContainerTrigger("c" * 64, {"docker_url": EVIL, "timeout": 1}, 0.01)
    with pytest.raises(PolicyError, match="allowed_clusters"):
        asyncio.run(first_event(trigger))


@pytest.mark.docker
def test_the_trigger_logs_in_nowhere_and_reads_no_file_the_author_named(docker_client):
    forged = {
        "docker_url": DockerOptions().engine_url,
        "docker_conn_id": "no_such_connection",  # a login from the triggerer, with any connection
        "tls_ca_cert": "/nonexistent/ca.pem",  # a file of the triggerer's, chosen by the author
        "timeout": 10,
    }
    payload = asyncio.run(first_event(DockerContainerTrigger("c" * 64, forged, 0.01)))
    assert payload["status"] == "missing"  # it reached the engine as the triggerer's own, and found no container
