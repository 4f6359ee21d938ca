"""What a derived image is made of: its recipe, the worker files it gets, and its content-hash tag.

A derived image is the parent image with the task's requirements installed (uv by default, pip on request) by an
install container (the recipe: ``recipe.py``; the containers: ``engine.py``). Its tag is a hash of the parent image's
id, the recipe (requirements, installer, indexes, the commands and environment), the content of every file it gets
(CA bundle; wheel directories by name, size and mtime; the runtime where it installs) and the provider's runtime
version: the same inputs always give the same tag, so an image is built once and found again in milliseconds. The
worker files a task names for its build are checked by the policy layer before anything is read (``policy/build.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

from airflow_gpu_provider.backends.docker.images.recipe import (
    BUILD_DIR,
    CA_PATH,
    DEPS_DIR,
    SHARE,
    Recipe,
    credentialed_commands,
    image_environment,
    install_commands,
    install_environment,
)
from airflow_gpu_provider.backends.docker.images.reuse import requirement_keys
from airflow_gpu_provider.backends.docker.options import DockerOptions, UvSource
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.policy.build import CA_FIELD, BuildPolicy, local_directory, readable_input
from airflow_gpu_provider.runtime.protocol import ENVELOPE_VERSION, split_credentials
from airflow_gpu_provider.settings import ImageSettings
from airflow_gpu_provider.task import runtime_zip
from airflow_gpu_provider.task.labels import PROVIDER
from airflow_gpu_provider.version import __version__

__all__ = ["CA_PATH", "DEPS_DIR", "SHARE", "BuildOptions", "DerivedImageSpec", "derived_image_spec", "worker_uv"]
LABEL_PREFIX = PROVIDER
RUNTIME_VERSION = f"{__version__}/envelope-{ENVELOPE_VERSION}"
"""Part of every tag: a provider release that changes how images are built gets new images."""
GO_ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x"}


@dataclass(frozen=True)
class BuildOptions:
    """How derived images are built and named (from ``backend_options`` and ``[gpu]``).

    :param repository: image name (without tag) of derived images, e.g. ``airflow-gpu-derived``
    :param registry: registry and namespace to push to (``registry.example.com/ml``); ``None`` keeps images local
    :param ca_bundle: PEM file on the worker that installs inside the build must trust
    :param uv_source: ``"worker"`` copies the worker's uv binary in (fast); ``"pip"`` pip-installs uv first
    :param compile_bytecode: compile ``.pyc`` files into the image (faster imports in every task run)
    :param policy: what of the worker a build may read (default: this worker's ``[gpu]``, read when building)
    """

    repository: str = DockerOptions.repository
    registry: str | None = None
    ca_bundle: str | None = None
    uv_source: UvSource = DockerOptions.uv_source
    compile_bytecode: bool = DockerOptions.compile_bytecode
    policy: BuildPolicy | None = None

    @property
    def image_name(self) -> str:
        """``registry/repository`` or just ``repository``."""
        return f"{self.registry.rstrip('/')}/{self.repository}" if self.registry else self.repository


@dataclass(frozen=True)
class DerivedImageSpec:
    """A derived image before its parent is resolved: its recipe, the worker files it gets, and the inputs' hash.

    :param files: ``(name, path on the worker)`` of what the install container gets (``context.py``): uploaded into
        the image (``SHARE/<name>``, the CA bundle at :data:`CA_PATH`), or beside the installer in :data:`BUILD_DIR`
        when the index needs credentials; directories go flat (their regular files); checked again against
        ``policy`` when read, but for the admin's own CA bundle
    :param uv_binary: the worker's uv binary, uploaded too (not part of the hash: it is only a build tool)
    :param netrc: the index credentials, as a ``netrc`` file for the install container (not part of the hash
        either: new credentials do not change what is installed)
    :param steps: how the install container makes the image (``recipe.py``)
    :param policy: what of the worker the build may read (checked again when each file is read)
    :param labels: the image's labels
    :param recipe: the digest of everything but the requirements (``reuse.py``); empty where the image may not be
        another one's base (its index needs credentials)
    :param requirements: ``(project name, digest)`` of each requirement (``reuse.requirement_keys``)
    :param on_base: the steps when it is built on a derived image of the same recipe (the install alone)
    """

    parent: str
    name: str
    steps: Recipe
    files: tuple[tuple[str, str], ...] = ()
    fingerprint: str = ""
    uv_binary: str | None = None
    netrc: str = field(default="", repr=False)
    policy: BuildPolicy = field(default_factory=lambda: BuildPolicy((), None))
    labels: dict[str, str] = field(default_factory=dict)
    recipe: str = ""
    requirements: tuple[tuple[str, str], ...] = ()
    on_base: Recipe | None = None

    def tag_for(self, parent_id: str) -> str:
        """The image reference for a parent image id: ``name:<16 hex digits>``."""
        blob = json.dumps({"parent_id": parent_id, "inputs": self.fingerprint}, sort_keys=True).encode()
        return f"{self.name}:{hashlib.sha256(blob).hexdigest()[:16]}"


def worker_uv(image: ImageSettings, options: BuildOptions, architecture: str | None, log: logging.Logger) -> str | None:
    """The worker's uv binary, to copy into the build, when it runs on the parent image's ``architecture``.

    ``None`` when the installer is pip, ``uv_source`` is ``pip``, or the architectures differ (uv is then
    pip-installed in the image).
    """
    if image.python_package_installer != "uv" or options.uv_source != "worker":
        return None
    worker = GO_ARCHITECTURES.get(platform.machine(), platform.machine())
    if architecture != worker:
        log.info("The image is %s, the worker %s: uv is pip-installed in the image.", architecture, worker)
        return None
    from uv import find_uv_bin

    return find_uv_bin()


@functools.cache
def _uv_version() -> str:
    return importlib.metadata.version("uv")


def _file_fingerprint(path: Path, names: list[str] | None) -> dict[str, object]:
    if names is not None:  # a folder: the files it copies, by name, size and mtime
        return {name: [(info := (path / name).stat()).st_size, info.st_mtime_ns] for name in names}
    return {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def build_input(name: str, path: str, policy: BuildPolicy, *, value: str | None = None) -> list[str] | None:
    """Check a worker path the build copies in as ``name`` (``policy/build.py``); for a folder, the files it copies.

    The admin's own CA bundle (the Docker connection's extra ``ca_bundle``) is taken as it is.

    :raises PolicyError: when the policy refuses it
    :raises InvalidSettingError: when it does not exist
    """
    ca = name == "ca-bundle.pem"
    if ca and path == policy.ca_bundle:
        if not os.path.isfile(path):
            raise InvalidSettingError(
                "the Docker connection", "ca_bundle", path, "no such file on the worker", "a PEM file path"
            )
        return None
    owner, field_name = ("backend 'docker'", CA_FIELD) if ca else ("ImageSettings", "find_links")
    try:
        names = readable_input(path, directory=not ca, owner=owner, field=field_name, policy=policy, value=value)
    except FileNotFoundError:
        what = "file" if ca else "directory"
        raise InvalidSettingError(owner, field_name, value or path, f"no such {what} on the worker", "") from None
    return None if ca else names


def derived_image_spec(
    parent: str, image: ImageSettings, options: BuildOptions, *, uv_binary: str | None
) -> DerivedImageSpec:
    """Describe the derived image of ``image`` over ``parent``, reading the worker files it gets.

    :param uv_binary: the worker's uv binary to upload; ``None`` pip-installs uv in the image instead
    :raises InvalidSettingError: when the CA bundle or a local ``find_links`` directory does not exist
    :raises PolicyError: when ``[gpu_policy] allowed_build_paths`` does not allow it, or it could be a secret
    """
    policy = options.policy or BuildPolicy.current()
    netrc = split_credentials(image.installer_index_args())[1]
    inputs: dict[str, tuple[Path, list[str] | None]] = {}
    find_links: list[str] = []
    for link in image.find_links:
        directory = local_directory(link)
        if directory is None:
            find_links.append(link)
            continue
        name = f"find-links-{len(inputs)}"
        inputs[name] = Path(directory), build_input(name, directory, policy, value=link)
        find_links.append(f"{BUILD_DIR if netrc else SHARE}/{name}")
    if options.ca_bundle:
        inputs["ca-bundle.pem"] = Path(options.ca_bundle), build_input("ca-bundle.pem", options.ca_bundle, policy)
    files = tuple((name, str(path)) for name, (path, _) in inputs.items())
    uv_source: UvSource | None = None
    if image.python_package_installer == "uv":
        uv_source = "worker" if uv_binary else "pip"
    labels = {
        f"{LABEL_PREFIX}.derived": "true",
        f"{LABEL_PREFIX}.parent": parent,
        f"{LABEL_PREFIX}.requirements-hash": image.requirements_hash,
        f"{LABEL_PREFIX}.installer": image.python_package_installer,
        f"{LABEL_PREFIX}.runtime": RUNTIME_VERSION,
    }
    how = {"uv_source": uv_source, "uv_version": _uv_version(), "find_links": find_links,
           "compile_bytecode": options.compile_bytecode}  # fmt: skip
    ca, installed = bool(options.ca_bundle), bool(netrc)
    environment = tuple(image_environment(uv_source=uv_source, uv_version=_uv_version(), ca_bundle=ca,
                                          installed=installed).items())  # fmt: skip

    def recipe_of(of: ImageSettings, *, on_base: bool = False) -> Recipe:
        if installed:
            commands = credentialed_commands(of, **how)  # type: ignore[arg-type]
            install_env = install_environment(uv_source=uv_source, uv_version=_uv_version(), ca_bundle=ca)
            return Recipe(tuple(map(tuple, commands)), tuple(install_env.items()), environment, installed=True)
        commands = install_commands(of, on_base=on_base, **how)  # type: ignore[arg-type]
        return Recipe(tuple(map(tuple, commands)), environment, environment)

    prints = {name: _file_fingerprint(path, names) for name, (path, names) in inputs.items()}

    def fingerprint_of(steps: Recipe) -> str:
        runtime = {runtime_zip.FILE_NAME: {"sha256": runtime_zip.digest()}} if installed else {}
        return json.dumps({"recipe": steps.text(), "files": {**prints, **runtime}, "runtime": RUNTIME_VERSION},
                          sort_keys=True)  # fmt: skip

    steps = recipe_of(image)
    reusable = not installed  # an install container's image is never another one's base (reuse.py)
    recipe = fingerprint_of(recipe_of(dataclasses.replace(image, requirements=()))) if reusable else ""
    return DerivedImageSpec(
        parent,
        options.image_name,
        steps,
        files,
        fingerprint_of(steps),
        uv_binary if uv_source == "worker" else None,
        netrc,
        policy=policy,
        labels=labels,
        recipe=hashlib.sha256(recipe.encode()).hexdigest() if reusable else "",
        requirements=requirement_keys(image.requirements) if reusable else (),
        on_base=recipe_of(image, on_base=True) if reusable else None,
    )
