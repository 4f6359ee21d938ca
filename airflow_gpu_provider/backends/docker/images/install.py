"""A derived image made by containers: the install container runs the recipe, a commit makes the image.

Each step is a call the engine's authorization plugin judges whole (a create like any task's, an upload into a
container without a host folder, a commit of exactly the provider's form): nothing goes through ``POST /build``.
:func:`build` runs a recipe (``recipe.py``): the install container, from the parent image (or a derived image of the
same recipe, ``reuse.py``), gets the worker's files through the Docker API (``put_archive`` from a temporary file:
no bind mount, so remote engines work too), runs the install, and is committed as the image; with index credentials
(rule B2, docs/security.md: no image layer ever holds a credential) it is removed instead, once what it installed is
read back (``get_archive``), and that goes into a container of the parent image that never runs, which is committed.
Every container runs as root with every capability dropped and ``no-new-privileges``, carries its builder's label
(the next build removes it if its worker dies meanwhile: ``builds.py``) and is removed on every path.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Mapping
from typing import Any

from docker.errors import APIError, NotFound

from airflow_gpu_provider.backends.docker.images import ImageError
from airflow_gpu_provider.backends.docker.images.context import image_files, install_files, installed_files
from airflow_gpu_provider.backends.docker.images.recipe import DEPS_DIR, Recipe, extended
from airflow_gpu_provider.backends.docker.images.spec import DerivedImageSpec
from airflow_gpu_provider.runtime.protocol import redact
from airflow_gpu_provider.task.output import LineSplitter

TAIL_LINES = 30
NEVER_RUN = ["true"]  # the command of the container that only carries the installed files to the commit


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


def _create(client: Any, image: str, entrypoint: list[str], environment: Mapping[str, str], *, user: str,
            labels: Mapping[str, str]) -> str:  # fmt: skip
    host_config = client.create_host_config(cap_drop=["ALL"], security_opt=["no-new-privileges:true"])
    return str(client.create_container(
        image, entrypoint=entrypoint, environment=dict(environment) or None, user=user, labels=dict(labels),
        host_config=host_config,
    )["Id"])  # fmt: skip


def _run(client: Any, container_id: str, source: str, log: logging.Logger) -> None:
    client.start(container_id)
    tail = _log_output(client, container_id, log)
    status = int(client.wait(container_id)["StatusCode"])
    if status != 0:
        raise ImageError(
            f"Installing the requirements into {source} failed (exit status {status}).\nLast output:\n"
            + "\n".join(tail)
        )


def _commit(client: Any, container_id: str, tag: str, parent: Mapping[str, Any], steps: Recipe, *,
            labels: Mapping[str, str]) -> None:  # fmt: skip
    """Commit the container as ``tag``: the parent's command, user and entrypoint, its environment with the recipe's.

    The engine merges the container's own configuration into what is not given here (the install container's
    entrypoint where the parent has none: an empty one is given).
    """
    repository, _, name = tag.rpartition(":")
    conf = {
        "Env": extended(parent.get("Env") or [], dict(steps.environment)),
        "Labels": dict(labels),
        "Entrypoint": parent.get("Entrypoint") or [],
        "Cmd": parent.get("Cmd") or None,
        "User": parent.get("User") or None,
        "WorkingDir": parent.get("WorkingDir") or None,
    }
    client.commit(container_id, repository=repository, tag=name, conf=conf)


def build(client: Any, spec: DerivedImageSpec, source: str, tag: str, *, labels: Mapping[str, str],
          log: logging.Logger, on_base: bool = False) -> None:  # fmt: skip
    """Make ``tag`` from the image ``source`` by the spec's recipe; remove every container it made, whatever happens.

    :param source: the parent image, or (``on_base``) the derived image it is built on, which has the files already
    :param labels: the image's labels (its containers carry them too)
    :raises ImageError: when the install fails (its last lines), or the engine refuses a step
    """
    steps = spec.on_base if on_base and spec.on_base is not None else spec.steps
    parent = client.inspect_image(source)["Config"] or {}
    user = "0:0" if parent.get("User") else ""  # the image's own root, or root where it runs as another user
    made: list[str] = []
    try:
        made.append(
            _create(client, source, steps.entrypoint(), dict(steps.install_environment), user=user, labels=labels)
        )
        files = install_files(spec) if steps.installed else None if on_base else image_files(spec)
        if files is not None:
            with files:
                client.put_archive(made[0], "/", files)
        _run(client, made[0], source, log)
        if steps.installed:  # the credentials stay in the install container: the files go into a fresh one
            try:
                chunks, _ = client.get_archive(made[0], DEPS_DIR)
            except NotFound:  # the parent image had everything: nothing was installed
                chunks = None
            try:
                with installed_files(spec, chunks) as installed:
                    made.append(_create(client, source, NEVER_RUN, {}, user=user, labels=labels))
                    client.put_archive(made[1], "/", installed)
            finally:
                if chunks is not None:
                    chunks.close()
        _commit(client, made[-1], tag, parent, steps, labels=labels)
    finally:
        for container_id in made:
            with contextlib.suppress(NotFound, APIError):
                client.remove_container(container_id, force=True, v=True)
