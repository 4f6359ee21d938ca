"""Images on a Docker engine: find or pull a parent image, build a derived image once, push it.

Everything here talks to the engine through a docker-py ``APIClient`` (from ``DockerHook``), streaming build,
pull and push progress to the task log. Run time only: DAG parsing never imports this module.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import tarfile
import tempfile
import time
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from docker.errors import APIError, ImageNotFound, NotFound
from docker.utils import parse_repository_tag

from airflow_gpu_provider.backends.docker.images.dockerfile import INSTALL_STAGE, LABEL_PREFIX, DerivedImageSpec
from airflow_gpu_provider.backends.docker.options import PullPolicy
from airflow_gpu_provider.exceptions import GpuTaskError
from airflow_gpu_provider.host.state import exclusive
from airflow_gpu_provider.runtime.protocol import redact
from airflow_gpu_provider.task import runtime_zip

TAIL_LINES = 30
_RUNNING_IN = re.compile(r"Running in ([0-9a-f]{12,64})")
_STEP_IMAGE = re.compile(r"---> ([0-9a-f]{12,64})\b")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class ImageError(GpuTaskError):
    """An image could not be found, pulled, built or pushed."""


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


def _build_context(spec: DerivedImageSpec, handle: Any) -> None:
    """Write the build context (Dockerfile, uv, CA bundle, wheel directories, the runtime) as a tar into ``handle``."""
    with tarfile.open(fileobj=handle, mode="w") as tar:
        dockerfile = spec.dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size, info.mode = len(dockerfile), 0o644
        tar.addfile(info, io.BytesIO(dockerfile))
        if spec.uv_binary:
            tar.add(spec.uv_binary, arcname="uv", recursive=False)
        if spec.netrc:  # from memory: the credentials are never written to a file on the worker
            secret = spec.netrc.encode()
            info = tarfile.TarInfo("netrc")
            info.size, info.mode = len(secret), 0o600
            tar.addfile(info, io.BytesIO(secret))
        if spec.runtime:  # the install stage runs the runtime's installer
            runtime = runtime_zip.archive()
            info = tarfile.TarInfo(runtime_zip.FILE_NAME)
            info.size, info.mode = len(runtime), 0o644
            tar.addfile(info, io.BytesIO(runtime))
        for name, path in spec.files:
            source = Path(path)
            if source.is_dir():
                tar.add(source, arcname=name, recursive=False)
                for entry in sorted(source.iterdir()):
                    if entry.is_file():
                        tar.add(entry, arcname=f"{name}/{entry.name}", recursive=False)
            else:
                tar.add(source, arcname=name, recursive=False)
    handle.seek(0)


def _remove_containers(client: Any, ids: Iterable[str], log: logging.Logger) -> None:

    for container_id in ids:
        with contextlib.suppress(NotFound):
            client.remove_container(container_id, force=True)
            log.info("Removed intermediate build container %s", container_id)


def build_image(client: Any, spec: DerivedImageSpec, tag: str, log: logging.Logger, *, nocache: bool = False) -> None:
    """Build ``spec`` as ``tag`` through the engine, streaming progress; leave no intermediate container behind."""
    log.info("Building derived image %s FROM %s:\n%s", tag, spec.parent, redact(spec.dockerfile.rstrip()))
    started = time.monotonic()
    lines: list[str] = []
    built = False
    with tempfile.TemporaryFile(prefix="airflow-gpu-context-") as context:
        _build_context(spec, context)
        try:
            stream = client.build(
                fileobj=context,
                custom_context=True,
                tag=tag,
                rm=True,
                forcerm=True,  # remove intermediate containers even when a step fails
                pull=False,
                decode=True,
                nocache=nocache,
            )
            _consume(_recording(stream, lines), log)
            built = True
        except (APIError, ImageError) as err:
            raise ImageError(
                f"Could not build the derived image {tag} (the requirements installed into {spec.parent}): "
                f"{getattr(err, 'explanation', None) or err}"
            ) from None
        finally:
            output = "\n".join(lines)
            if not built:  # failed or interrupted (task timeout): the step's container must not outlive it
                _remove_containers(client, _RUNNING_IN.findall(output), log)
                _remove_step_images(client, _STEP_IMAGE.findall(output), log)
            if spec.netrc:  # the install stage's images hold the credentials: none may stay on the engine
                _remove_install_stage(client, _STEP_IMAGE.findall(output), log)
    log.info("Built derived image %s in %.1fs", tag, time.monotonic() - started)


def _remove_step_images(client: Any, ids: list[str], log: logging.Logger) -> None:
    """The images of the steps of a failed build (untagged ones only: the parent is not among them), newest first."""
    for image_id in reversed(ids):
        found = inspect_image(client, image_id)
        if found is None or found.get("RepoTags"):
            continue
        with contextlib.suppress(NotFound, APIError):  # still used by another image: it stays with it
            client.remove_image(image_id, noprune=True)
            log.info("Removed the image %s of a step of the failed build", image_id)


def _remove_install_stage(client: Any, steps: list[str], log: logging.Logger) -> None:
    """The install stage's images of this build (its steps), not those of a concurrent build."""
    label = f"{LABEL_PREFIX}.build-stage={INSTALL_STAGE}"
    for found in client.images(all=True, filters={"label": label}):
        if not any(found["Id"].split(":")[-1].startswith(step) for step in steps):
            continue
        with contextlib.suppress(NotFound, APIError):  # in use by a concurrent build: that build removes it
            client.remove_image(found["Id"], force=True, noprune=False)
            log.info("Removed the install stage's image %s", found["Id"][:19])


def _recording(chunks: Iterable[dict[str, Any]], into: list[str]) -> Iterator[dict[str, Any]]:
    for chunk in chunks:
        into.append(str(chunk.get("stream", "")))
        yield chunk


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
    lock = Path(lock_dir) / (re.sub(r"[^A-Za-z0-9_.-]", "_", tag) + ".lock")
    with exclusive(lock) as waited:
        if inspect_image(client, tag) is not None:
            log.info("Using derived image %s, built by another task while this one waited %.1fs", tag, waited)
            return tag, False
        build_image(client, spec, tag, log)
        if push:
            push_image(client, tag, log)
    return tag, True
