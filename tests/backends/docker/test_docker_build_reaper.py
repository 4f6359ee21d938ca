"""The reaper of dead builds (``images/builds.py``): a dead builder's containers go, the containers of its image stay.

Every container of a derived image inherits the image's builder label. The builder of a cached image is usually long
gone, so a reaper that went by the label alone would remove other tasks' running containers (it removed the
pod-in-docker "nodes" of ``test_k8s_accelerate.py`` mid-run, exit 137, whenever another session built an image).
"""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import subprocess
import uuid

import pytest
from backends.docker.docker_fixtures import BASE_IMAGE, TEST_REPOSITORY

import docker
from airflow_gpu_provider.backends.docker.durable import DEPLOYMENT_LABEL
from airflow_gpu_provider.backends.docker.images.builds import BUILDER_LABEL, build_containers, reap_dead_builds
from airflow_gpu_provider.host.workers import is_dead, started_at

pytestmark = pytest.mark.docker
TEST_LABEL = {"airflow-gpu-provider-test": "build-reaper"}


def dead_identity() -> str:
    """The identity of a worker of this host that has exited."""
    process = subprocess.Popen(["sleep", "60"])
    identity = f"{socket.gethostname()}:{process.pid}:{started_at(process.pid)}"
    process.kill()
    process.wait()
    assert is_dead(identity)
    return identity


def exists(client, container_id: str) -> bool:
    try:
        client.inspect_container(container_id)
    except docker.errors.NotFound:
        return False
    return True


def test_a_dead_builders_install_container_is_reaped_but_not_a_container_of_the_image_it_built(docker_client):
    builder = dead_identity()
    tag = f"{TEST_REPOSITORY}:reaper-{uuid.uuid4().hex[:8]}"
    dockerfile = (
        f"FROM {BASE_IMAGE}\nLABEL {BUILDER_LABEL}={builder}\n"  # the builder label a build puts on what it makes
    )
    list(docker_client.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, decode=True))
    created = []
    try:
        of_image = docker_client.create_container(tag, command=["true"], labels=TEST_LABEL)["Id"]
        created.append(of_image)
        install = docker_client.create_container(  # an install container: the parent image, the builder's label
            BASE_IMAGE, command=["true"], labels={**TEST_LABEL, BUILDER_LABEL: builder}
        )["Id"]
        created.append(install)
        theirs = docker_client.create_container(  # another Airflow deployment's on this engine: its workers' own
            BASE_IMAGE, command=["true"], labels={**TEST_LABEL, BUILDER_LABEL: builder, DEPLOYMENT_LABEL: "staging"}
        )["Id"]
        created.append(theirs)
        assert docker_client.inspect_container(of_image)["Config"]["Labels"][BUILDER_LABEL] == builder  # inherited
        assert {c["Id"] for c in build_containers(docker_client) if c["Id"] in created} == {install, theirs}

        reap_dead_builds(docker_client, logging.getLogger("test"))
        assert not exists(docker_client, install)
        assert exists(docker_client, of_image) and exists(docker_client, theirs)
    finally:
        for container_id in created:
            with contextlib.suppress(docker.errors.NotFound):
                docker_client.remove_container(container_id, force=True)
        docker_client.remove_image(tag, force=True)
