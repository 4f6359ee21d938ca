"""Who built what on the engine: what a dead builder left is removed before the next build.

Rule B2 (docs/security.md: what a killed build leaves is reaped by label): a worker killed during a build cannot
clean up after it: its install container may still run, its build's step images stay in the build cache. So every
container and image a build makes carries ``airflow-gpu-provider.builder=<worker identity>``
(:func:`~airflow_gpu_provider.host.workers.worker_identity`): its containers and the image it commits
(``install.py``). Before a build, the containers of the dead builders of this host are removed, then their untagged
images, children first; an image that another image is built on stays with it, and the builders of other hosts
sharing a remote engine, and those of another Airflow deployment on this host, are left to them.

Every container of a finished derived image inherits the image's label too: a task's container, a pod run in
Docker, anyone's. Such a container is no build's (:func:`build_containers`): its builder having died long ago is the
normal case (a worker builds an image once, later tasks reuse it), and it is never removed here.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from docker.errors import APIError, NotFound

from airflow_gpu_provider.backends.docker.durable import DEPLOYMENT_LABEL
from airflow_gpu_provider.host.workers import deployment, is_dead, worker_identity
from airflow_gpu_provider.task.labels import docker_label

BUILDER_LABEL = docker_label("builder")


def builder_labels() -> dict[str, str]:
    """The label of what this worker's build makes."""
    return {BUILDER_LABEL: worker_identity()}


def _dead(found: dict[str, Any], ours: str) -> bool:
    """Built by a dead worker of this deployment (one without the label: made before 0.2.0)."""
    labels = found.get("Labels") or {}
    return labels.get(DEPLOYMENT_LABEL, ours) == ours and is_dead(labels.get(BUILDER_LABEL, ""))


def _untagged(image: dict[str, Any]) -> bool:
    return not [tag for tag in image.get("RepoTags") or () if tag != "<none>:<none>"]


def build_containers(client: Any) -> list[dict[str, Any]]:
    """The containers that builds made (step and install containers), whoever's; not those of finished images.

    A container whose builder label is the one of the tagged derived image it runs only inherited it: it is a
    container of that image, not a build's. An install container runs the parent image under its own builder's
    label, a build step an untagged step image: both are builds'.
    """
    finished = {
        image["Id"]: (image.get("Labels") or {}).get(BUILDER_LABEL)
        for image in client.images(filters={"label": BUILDER_LABEL})  # top-level images, not the steps'
        if not _untagged(image)
    }
    return [
        container
        for container in client.containers(all=True, filters={"label": BUILDER_LABEL})
        if finished.get(container.get("ImageID", "")) != (container.get("Labels") or {}).get(BUILDER_LABEL)
    ]


def reap_dead_builds(client: Any, log: logging.Logger) -> list[str]:
    """Remove what the builds of this host's dead workers left: containers, then untagged images; their ids."""
    reaped, ours = [], deployment()
    for container in build_containers(client):
        if _dead(container, ours):
            with contextlib.suppress(NotFound, APIError):
                client.remove_container(container["Id"], force=True, v=True)
                reaped.append(container["Id"])
    images = [i for i in client.images(all=True, filters={"label": BUILDER_LABEL}) if _dead(i, ours) and _untagged(i)]
    while images:  # children first: an image is removed once no other one of these is built on it
        parents = {image.get("ParentId") for image in images}
        leaves = [image for image in images if image["Id"] not in parents]
        for image in leaves:
            with contextlib.suppress(NotFound, APIError):  # another image is built on it: it stays with that one
                client.remove_image(image["Id"], noprune=True)
                reaped.append(image["Id"])
        images = [image for image in images if image not in leaves]
    if reaped:
        log.warning("Removed %d containers and images left by a build whose worker died", len(reaped))
    return reaped
