"""The install container of a derived image whose index needs credentials: no image layer ever holds them.

Rule B2 (docs/security.md: no image layer ever holds a credential): the requirements are installed in a container
from the parent image, never in a build step. The container gets the runtime, uv, the CA bundle, the wheel folders
and the netrc file through the Docker API (``put_archive`` into its own filesystem, from memory: no file on the
worker, no bind mount, so remote engines work too), runs the runtime's installer into
:data:`~.recipe.DEPS_DIR`, and is removed once its installed files are read back (``get_archive``): the derived
image's build copies those in. The credentials live in the container's writable layer for the install's time only;
nothing is committed from it. It runs as root with every capability dropped and ``no-new-privileges``, and carries
its builder's label, so that the next build removes it if its worker dies meanwhile (``builds.py``).
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections import deque
from typing import IO, Any

from docker.errors import APIError, NotFound

from airflow_gpu_provider.backends.docker.images import ImageError
from airflow_gpu_provider.backends.docker.images.context import install_files
from airflow_gpu_provider.backends.docker.images.dockerfile import DerivedImageSpec
from airflow_gpu_provider.backends.docker.images.recipe import DEPS_DIR
from airflow_gpu_provider.runtime.protocol import redact
from airflow_gpu_provider.task.labels import docker_label
from airflow_gpu_provider.task.output import LineSplitter

STAGE_LABEL = docker_label("build-stage")
TAIL_LINES = 30


def _log_output(client: Any, container_id: str, log: logging.Logger) -> list[str]:
    """Log the container's output as it comes; return its last lines."""
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    splitter = LineSplitter()
    for chunk in client.logs(container_id, stream=True, follow=True):
        for line in splitter.feed(chunk):
            tail.append(redact(line))
            log.info("%s", tail[-1])
    for line in splitter.flush():
        tail.append(redact(line))
        log.info("%s", tail[-1])
    return list(tail)


def install_requirements(
    client: Any, spec: DerivedImageSpec, labels: dict[str, str], log: logging.Logger
) -> IO[bytes] | None:
    """Install the requirements in an install container; a tar of its :data:`DEPS_DIR` (a temporary file), if any.

    :param labels: the container's labels (its builder's among them)
    :raises ImageError: when the install fails, naming the installer's last lines
    """
    log.info("Installing the requirements in a container from %s: %s", spec.parent, redact(" ".join(spec.install)))
    host_config = client.create_host_config(cap_drop=["ALL"], security_opt=["no-new-privileges:true"])
    container_id = client.create_container(
        spec.parent,
        command=list(spec.install),
        environment=dict(spec.install_environment),
        labels={**labels, STAGE_LABEL: "install"},
        user="0:0",  # DEPS_DIR is made beside the image's own folders, whatever user the image runs as
        working_dir="/",
        host_config=host_config,
    )["Id"]
    try:
        client.put_archive(container_id, "/", install_files(spec))
        client.start(container_id)
        tail = _log_output(client, container_id, log)
        status = int(client.wait(container_id)["StatusCode"])
        if status != 0:
            raise ImageError(
                f"Installing the requirements into {spec.parent} failed (exit status {status}).\nLast output:\n"
                + "\n".join(tail)
            )
        try:
            chunks, _ = client.get_archive(container_id, DEPS_DIR)
        except NotFound:  # the parent image had everything: nothing was installed
            return None
        installed = tempfile.TemporaryFile(prefix="airflow-gpu-deps-")  # noqa: SIM115 - the caller closes it
        try:
            for chunk in chunks:
                installed.write(chunk)
        except BaseException:
            installed.close()
            raise
        installed.seek(0)
        return installed
    finally:
        with contextlib.suppress(NotFound, APIError):
            client.remove_container(container_id, force=True, v=True)
