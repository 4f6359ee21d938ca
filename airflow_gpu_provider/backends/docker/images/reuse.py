"""Rebuilds that reuse: a derived image whose requirements grew is built on an earlier one of the same recipe.

A derived image's tag hashes everything it is made of, so a task that adds a package to its requirements needs a new
image. Built from its parent, it would install everything again: the downloads, the install, the compilation of
every module and the engine's commit of the whole layer. Instead it is built ``FROM`` the derived image of the same
recipe (the parent image's id, installer, indexes, wheel folders, CA bundle and runtime: everything but the
requirements) whose requirements are all among the new ones, the most of them: its install container runs that image.
The installer resolves the whole list against what that base has installed, as it does against a parent image's own
packages, so the new layer holds only what was added.

Which images may be a base, and the trust in them:

- the base asked for nothing the new list does not (the same requirements, byte for byte): whatever ran while it was
  built (a source distribution's build) would run in a build from the parent too. An image holding another version
  of a project, or one the new list dropped, is never a base: another task's requirements could otherwise leave what
  their build did in this task's image;
- only the derived images installed without credentials carry the recipe label: an image whose index needs them is
  never a base (``install.py``), so no build starts from a layer made with credentials;
- the labels name requirements by project name and a digest of the (redacted) requirement: no label holds a
  requirement's text or a digest of a secret;
- the engine is trusted as it is for the content-hash tags (whoever can tag an image there can run anything);
- a chain of such builds is at most :data:`MAX_DEPTH` deep (an image has at most 125 layers): the next build starts
  from the parent again.

An image built on a base keeps the base's layers: removing the base (``docker rmi``) only untags it while images
are built on it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from airflow_gpu_provider.runtime.protocol import redact
from airflow_gpu_provider.task.labels import docker_label

if TYPE_CHECKING:
    from airflow_gpu_provider.backends.docker.images.recipe import Recipe

RECIPE_LABEL = docker_label("recipe")
REQUIREMENTS_LABEL = docker_label("requirements")
DEPTH_LABEL = docker_label("reuse-depth")
MAX_DEPTH = 8


class Reusable(Protocol):
    """What of a derived image's spec (``dockerfile.DerivedImageSpec``) a reuse needs."""

    @property
    def recipe(self) -> str:
        """The digest of everything but the requirements; empty where the image may not be a base."""

    @property
    def requirements(self) -> tuple[tuple[str, str], ...]:
        """:func:`requirement_keys` of its requirements."""

    @property
    def on_base(self) -> Recipe | None:
        """Its recipe on a base (the install alone)."""


class Base(NamedTuple):
    """The derived image a build starts from: its id, how many reused builds it stands on, what it shares."""

    id: str
    depth: int
    shared: int


def requirement_keys(requirements: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """``(project name, digest of the redacted requirement)`` of each requirement, sorted."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    return tuple(
        sorted(
            (canonicalize_name(Requirement(text).name), hashlib.sha256(redact(text).encode()).hexdigest()[:16])
            for text in requirements
        )
    )


def recipe_of(spec: Reusable, parent_id: str) -> str:
    """The recipe label's value: ``spec``'s recipe over the parent image ``parent_id``."""
    return hashlib.sha256(f"{parent_id}/{spec.recipe}".encode()).hexdigest()[:32]


def recipe_labels(spec: Reusable, parent_id: str, base: Base | None) -> dict[str, str]:
    """The labels that make the image a base for later builds of its recipe (none where it may not be one)."""
    if not spec.recipe:
        return {}
    return {
        RECIPE_LABEL: recipe_of(spec, parent_id),
        REQUIREMENTS_LABEL: json.dumps([list(key) for key in spec.requirements]),
        DEPTH_LABEL: str(0 if base is None else base.depth + 1),
    }


def pick_base(images: Sequence[dict[str, Any]], spec: Reusable, recipe: str) -> Base | None:
    """The image of ``images`` (``client.images()`` entries) that ``spec`` is best built on, if any.

    It must be a tagged image of the recipe ``recipe`` whose requirements are all among ``spec``'s (at least one),
    standing on fewer than :data:`MAX_DEPTH` reused builds; of those, the one with the most requirements, then the
    newest.
    """
    wanted = set(spec.requirements)
    best: tuple[tuple[int, int], Base] | None = None
    for image in images:
        labels = image.get("Labels") or {}
        if labels.get(RECIPE_LABEL) != recipe or not [t for t in image.get("RepoTags") or () if t != "<none>:<none>"]:
            continue
        try:
            theirs = {(str(name), str(digest)) for name, digest in json.loads(labels[REQUIREMENTS_LABEL])}
            depth = int(labels.get(DEPTH_LABEL, "0"))
        except (KeyError, TypeError, ValueError):
            continue
        if not theirs or not theirs <= wanted or depth + 1 > MAX_DEPTH:
            continue
        rank = (len(theirs), int(image.get("Created") or 0))
        if best is None or rank > best[0]:
            best = (rank, Base(str(image["Id"]), depth, len(theirs)))
    return None if best is None else best[1]


def find_base(client: Any, spec: Reusable, parent_id: str, log: logging.Logger) -> Base | None:
    """The derived image on the engine that ``spec`` is best built on (:func:`pick_base`), if any."""
    if not spec.recipe:
        return None
    recipe = recipe_of(spec, parent_id)
    base = pick_base(client.images(filters={"label": f"{RECIPE_LABEL}={recipe}"}), spec, recipe)
    if base is not None:
        log.info(
            "Building on %s, a derived image of the same recipe with %d of the %d requirements: only what changed "
            "is installed",
            base.id[:19],
            base.shared,
            len(spec.requirements),
        )
    return base
