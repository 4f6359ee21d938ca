"""Images on a Docker engine: find or pull a parent image, make a derived image once, push it.

Everything here talks to the engine through a docker-py ``APIClient`` (from ``DockerHook``), streaming the install,
pull and push progress to the task log. Run time only: DAG parsing never imports this module.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import time
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from docker.errors import APIError, ImageNotFound
from docker.utils import parse_repository_tag

from airflow_gpu_provider.backends.docker.durable import DEPLOYMENT_LABEL
from airflow_gpu_provider.backends.docker.images import ImageError
from airflow_gpu_provider.backends.docker.images.builds import builder_labels, reap_dead_builds
from airflow_gpu_provider.backends.docker.images.cache import key_of
from airflow_gpu_provider.backends.docker.images.install import build
from airflow_gpu_provider.backends.docker.images.reuse import Base, find_base, recipe_labels
from airflow_gpu_provider.backends.docker.images.spec import DerivedImageSpec
from airflow_gpu_provider.backends.docker.options import PullPolicy
from airflow_gpu_provider.host.state import exclusive
from airflow_gpu_provider.host.workers import deployment
from airflow_gpu_provider.runtime.protocol import redact

TAIL_LINES = 30
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _consume(chunks: Iterable[dict[str, Any]], log: logging.Logger) -> list[str]:
    """Log a build/pull/push progress stream line by line; raise :class:`ImageError` on an error entry.

    :return: the last lines, for error messages
    """
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    last_status: dict[str, str] = {}
    pending = ""  # build output arrives in pieces that do not end at line ends

    def emit(text: str) -> None:
        line = redact(_ANSI.sub("", text).rstrip())
        if line.strip():
            log.info("%s", line)
            tail.append(line)

    for chunk in chunks:
        if "error" in chunk:
            emit(pending)
            raise ImageError(f"{redact(str(chunk['error']).strip())}\nLast output:\n" + "\n".join(tail))
        if "stream" in chunk:
            *lines, pending = (pending + str(chunk["stream"])).split("\n")
            for line in lines:
                emit(line)
        elif "status" in chunk:
            layer = chunk.get("id", "")
            if last_status.get(layer) != chunk["status"]:  # progress bars repeat the same status
                last_status[layer] = chunk["status"]
                emit(f"{layer}: {chunk['status']}" if layer else chunk["status"])
    emit(pending)
    return list(tail)


def _split(reference: str) -> tuple[str, str | None]:
    repository, tag = parse_repository_tag(reference)
    return repository, tag


def inspect_image(client: Any, reference: str) -> dict[str, Any] | None:
    """The engine's description of an image, or ``None`` when it does not have it."""
    try:
        return client.inspect_image(reference)
    except ImageNotFound:
        return None


def pull_image(client: Any, reference: str, log: logging.Logger) -> dict[str, Any]:
    """Pull an image with progress in the log; return its description."""
    repository, tag = _split(reference)
    log.info("Pulling image %s", reference)
    try:
        _consume(client.pull(repository, tag=tag or "latest", stream=True, decode=True), log)
    except (APIError, ImageError) as err:
        raise ImageError(f"Pulling {reference} failed: {getattr(err, 'explanation', None) or err}") from None
    found = inspect_image(client, reference)
    if found is None:
        raise ImageError(f"Pulling {reference} reported success but the engine does not have the image.")
    return found


def resolve_image(client: Any, reference: str, policy: PullPolicy | str, log: logging.Logger) -> dict[str, Any]:
    """Find ``reference`` on the engine, pulling it as ``policy`` says.

    :raises ImageError: naming the image and what to do when it is missing and cannot be pulled
    """
    found = None if policy == "always" else inspect_image(client, reference)
    if found is not None:
        return found
    if policy == "never":
        raise ImageError(
            f"Docker image {reference!r} is not on the engine and pull='never'. Load or build it first "
            "(docker load / docker build), or allow pulling with backend_options pull='missing'."
        )
    try:
        return pull_image(client, reference, log)
    except ImageError as err:
        raise ImageError(
            f"Docker image {reference!r} is not on the engine and cannot be pulled: {err}. Check the image name, "
            "load the image with docker load, or give docker_conn_id for a private registry."
        ) from None


def build_image(
    client: Any,
    spec: DerivedImageSpec,
    tag: str,
    log: logging.Logger,
    *,
    parent_id: str = "",
    base: Base | None = None,
) -> None:
    """Make ``spec`` as ``tag`` through the engine (``install.py``), streaming the install's output.

    What the build makes carries this worker's label (``builds.py``) and the deployment's (the engine's
    authorization plugin lets a deployment reach only its own images and containers).

    :param parent_id: the parent image's id: the image is labelled as a base for later builds of its recipe
    :param base: a derived image of the same recipe to build on (``reuse.py``), instead of the parent
    """
    labels = {**spec.labels, **builder_labels(), DEPLOYMENT_LABEL: deployment(),
              **(recipe_labels(spec, parent_id, base) if parent_id else {})}  # fmt: skip
    source = spec.parent if base is None else f"{base.id[:19]} (a derived image of {spec.parent})"
    steps = spec.steps if base is None or spec.on_base is None else spec.on_base
    log.info("Building derived image %s from %s: %s", tag, source, redact(" && ".join(map(shlex.join, steps.commands))))
    started = time.monotonic()
    try:
        source_id = spec.parent if base is None else base.id
        build(client, spec, source_id, tag, labels=labels, log=log, on_base=base is not None)
    except (APIError, ImageError) as err:
        raise ImageError(
            f"Could not build the derived image {tag} (the requirements installed into {spec.parent}): "
            f"{getattr(err, 'explanation', None) or err}"
        ) from None
    log.info("Built derived image %s in %.1fs", tag, time.monotonic() - started)


def push_image(client: Any, reference: str, log: logging.Logger) -> None:
    """Push an image to its registry (logged in through the Docker connection, if any)."""
    repository, tag = _split(reference)
    log.info("Pushing %s", reference)
    try:
        _consume(client.push(repository, tag=tag, stream=True, decode=True), log)
    except (APIError, ImageError) as err:
        raise ImageError(f"Pushing {reference} failed: {getattr(err, 'explanation', None) or err}") from None


def ensure_derived_image(
    client: Any,
    spec: DerivedImageSpec,
    parent_id: str,
    *,
    lock_dir: str | os.PathLike[str],
    push: bool,
    log: logging.Logger,
) -> tuple[str, bool]:
    """Return the derived image's reference and whether this call built it.

    The tag is a content hash, so an existing image is reused as it is. Otherwise it is pulled from the registry
    (with ``push``), or built under a host-wide lock keyed by the tag: concurrent tasks build it once.
    """
    tag = spec.tag_for(parent_id)
    if inspect_image(client, tag) is not None:
        log.info("Using cached derived image %s", tag)
        return tag, False
    if push:
        with contextlib.suppress(ImageError):
            pull_image(client, tag, log)
            return tag, False
        log.info("%s is not in the registry yet; building it", tag)
    lock = Path(lock_dir) / f"{key_of(tag)}.lock"
    with exclusive(lock) as waited:
        if inspect_image(client, tag) is not None:
            log.info("Using derived image %s, built by another task while this one waited %.1fs", tag, waited)
            return tag, False
        reap_dead_builds(client, log)  # what a build killed with its worker left (its install container too)
        base = find_base(client, spec, parent_id, log)
        try:
            build_image(client, spec, tag, log, parent_id=parent_id, base=base)
        except ImageError:
            if base is None or inspect_image(client, base.id) is not None:
                raise
            log.warning("%s was removed during the build: building from %s", base.id[:19], spec.parent)
            build_image(client, spec, tag, log, parent_id=parent_id)
        if push:
            push_image(client, tag, log)
    return tag, True
