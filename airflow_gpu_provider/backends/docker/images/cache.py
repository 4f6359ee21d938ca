"""Derived images on a local engine, kept within ``[gpu] cache_size``: least recently used first, never one in use.

Each derived image a task of this host builds or uses has a use file in the state dir's ``docker-builds`` folder
(:mod:`~airflow_gpu_provider.host.caches`), held from before the task looks the image up until its container exists
(then the engine itself refuses to remove the image). After a build, the derived images of this state dir go, least
recently used first, until the own layers of those left (each one's size less its parent's) fit the cap; an image a
container uses stays (the engine's conflict). Images this state dir never used (another user's, another host's on a
shared engine) are neither counted nor removed.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from docker.errors import APIError, ImageNotFound

from airflow_gpu_provider.host import caches
from airflow_gpu_provider.task.labels import PROVIDER

DERIVED = f"{PROVIDER}.derived=true"
PARENT_LABEL = f"{PROVIDER}.parent"


def key_of(tag: str) -> str:
    """A derived image's tag as a name of the state dir (its build lock, its use file)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", tag)


@contextlib.contextmanager
def in_use(lock_dir: str | Path, tag: str) -> Iterator[None]:
    """Hold the derived image ``tag`` as used by this task, and mark it used now."""
    with caches.using(lock_dir, key_of(tag)):
        yield


def evict_images(client: Any, lock_dir: str | Path, limit: int, log: logging.Logger) -> list[str]:
    """Remove this state dir's least recently used derived images until they fit ``limit`` bytes; their tags."""
    sizes: dict[str, int] = {}
    tags: dict[str, str] = {}
    parents: dict[str, int] = {}
    for image in client.images(filters={"label": DERIVED}):
        parent = (image.get("Labels") or {}).get(PARENT_LABEL, "")
        if parent not in parents:
            try:
                parents[parent] = int(client.inspect_image(parent)["Size"]) if parent else 0
            except (ImageNotFound, APIError):
                parents[parent] = 0
        for tag in image.get("RepoTags") or ():
            if caches.use_file(lock_dir, key_of(tag)).exists():
                sizes[key_of(tag)], tags[key_of(tag)] = max(int(image.get("Size") or 0) - parents[parent], 0), tag

    def remove(key: str) -> bool:
        try:
            client.remove_image(tags[key])
        except ImageNotFound:
            return True
        except APIError:  # a container uses it (409): it stays with that one
            return False
        return True

    removed = caches.evict(lock_dir, sizes, limit, remove, what="derived image", log=log, named=tags.__getitem__)
    return [tags[key] for key in removed]
