"""What a derived image is made of: its Dockerfile, its build-context files and its content-hash tag.

A derived image is ``FROM`` the parent image with the task's requirements installed (uv by default, pip on
request). Its tag is a hash of the parent image's id, the Dockerfile (requirements, installer, indexes), the
content of every file copied in (CA bundle; wheel directories by name, size and mtime) and the provider's runtime
version: the same inputs always give the same tag, so an image is built once and found again in milliseconds.
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from airflow_gpu_provider.backends.docker.options import DockerOptions, UvSource
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.runtime.protocol import ENVELOPE_VERSION, INSTALL, split_credentials, uv_ca_variable
from airflow_gpu_provider.settings import ImageSettings
from airflow_gpu_provider.task import runtime_zip
from airflow_gpu_provider.task.labels import PROVIDER
from airflow_gpu_provider.version import __version__

SHARE = "/usr/local/share/airflow-gpu"
CA_PATH = f"{SHARE}/ca-bundle.pem"
DEPS_DIR = "/opt/airflow-gpu/site-packages"  # where a staged build installs (as Kubernetes init containers do)
INSTALL_STAGE = "airflow-gpu-install"
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
    """

    repository: str = DockerOptions.repository
    registry: str | None = None
    ca_bundle: str | None = None
    uv_source: UvSource = DockerOptions.uv_source
    compile_bytecode: bool = DockerOptions.compile_bytecode

    @property
    def image_name(self) -> str:
        """``registry/repository`` or just ``repository``."""
        return f"{self.registry.rstrip('/')}/{self.repository}" if self.registry else self.repository


@dataclass(frozen=True)
class DerivedImageSpec:
    """A derived image before its parent is resolved: Dockerfile, context files, and the inputs' hash.

    :param files: ``(name in the build context, path on the worker)``; directories are copied flat
    :param uv_binary: the worker's uv binary, copied in as ``uv`` (not part of the hash: it is only a build tool)
    :param netrc: the index credentials, as a ``netrc`` file for the install stage (not part of the hash either:
        new credentials do not change what is installed)
    :param runtime: the install stage runs the runtime's installer: its archive goes into the build context
    """

    parent: str
    dockerfile: str
    name: str
    files: tuple[tuple[str, str], ...] = ()
    fingerprint: str = ""
    uv_binary: str | None = None
    netrc: str = field(default="", repr=False)
    runtime: bool = False

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


def _local_directory(link: str) -> str | None:
    """The worker directory a ``find_links`` entry names, or ``None`` for a remote URL."""
    parsed = urlparse(link)
    if parsed.scheme in ("http", "https"):
        return None
    path = parsed.path if parsed.scheme == "file" else link
    if not os.path.isabs(path):
        raise InvalidSettingError(
            "ImageSettings", "find_links", link, "not an absolute path or URL", "'/abs/wheel/dir' or 'https://...'"
        )
    return path


def render_dockerfile(
    parent: str,
    image: ImageSettings,
    *,
    uv_source: UvSource | None,
    uv_version: str,
    ca_bundle: bool,
    find_links: Sequence[str],
    wheel_dirs: Sequence[str] = (),
    labels: Mapping[str, str] | None = None,
    compile_bytecode: bool = True,
    credentials: bool = False,
) -> str:
    """The Dockerfile text (pure).

    :param uv_source: where uv comes from, ``None`` when the installer is pip
    :param uv_version: the uv version to use (the worker's; ``uv_source="pip"`` installs the same one)
    :param find_links: ``--find-links`` values as the build sees them
    :param wheel_dirs: build-context directories copied to ``SHARE/<name>`` (local wheel directories)
    :param compile_bytecode: compile ``.pyc`` files in the image (pip's default; uv's ``--compile-bytecode``), so
        that tasks do not compile what they import in every fresh container
    :param credentials: the index needs credentials (a ``netrc`` file in the build context): they stay in a build
        stage that is not part of the image (see :func:`_staged`)
    """
    preamble = []
    if labels:  # first, so the build's intermediate containers carry them too (and can be told apart)
        preamble.append("LABEL " + " ".join(f"{key}={json.dumps(value)}" for key, value in sorted(labels.items())))
    if ca_bundle:
        preamble += [
            f"COPY ca-bundle.pem {CA_PATH}",
            f"ENV SSL_CERT_FILE={CA_PATH} REQUESTS_CA_BUNDLE={CA_PATH} PIP_CERT={CA_PATH}",
        ]
    environment = "PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore"
    if uv_source is not None:  # uv trusts the image's CA store like pip does, not only its bundled roots
        environment += f" {uv_ca_variable(uv_version)}=1"
    preamble.append(f"ENV {environment}")
    index_args = split_credentials(dataclasses.replace(image, find_links=tuple(find_links)).installer_index_args())[0]
    pip = ["python3", "-m", "pip", "install", "--no-cache-dir"]
    steps = []
    if uv_source == "worker":
        steps.append("COPY uv /usr/local/bin/uv")
    elif uv_source == "pip":
        steps.append(f"RUN {json.dumps([*pip, f'uv=={uv_version}'])}")
    steps += [f"COPY {name} {SHARE}/{name}" for name in wheel_dirs]
    if credentials:
        compiled = f"RUN {json.dumps(['python3', '-m', 'compileall', '-q', DEPS_DIR])}\n" if compile_bytecode else ""
        return _staged(parent, image, preamble, steps, index_args) + compiled
    if uv_source is None:
        installer = pip if compile_bytecode else [*pip, "--no-compile"]
    else:
        uv = "/usr/local/bin/uv" if uv_source == "worker" else "python3 -m uv"
        installer = [*uv.split(), "pip", "install", "--system", "--break-system-packages", "--no-cache"]
        installer += ["--python", "python3", *(["--compile-bytecode"] if compile_bytecode else [])]
    steps.append(f"RUN {json.dumps([*installer, *index_args, *image.requirements])}")
    return "\n".join([f"FROM {parent}", *preamble, *steps]) + "\n"


def _staged(parent: str, image: ImageSettings, preamble: list[str], steps: list[str], index_args: list[str]) -> str:
    """Two stages for an index that needs credentials: the legacy builder has no build secrets.

    The first stage gets the ``netrc`` file and runs the provider's installer (the runtime's, as Kubernetes init
    containers do: only what the parent image lacks, into ``DEPS_DIR``); the image is the parent plus that folder.
    Neither its layers nor its history nor its config hold the credentials; the first stage's images are removed
    after the build.
    """
    installer = [
        "env", f"NETRC={SHARE}/netrc", "python3", f"{SHARE}/{runtime_zip.FILE_NAME}", INSTALL, DEPS_DIR,
        image.python_package_installer, *index_args, "--", *image.requirements,
    ]  # fmt: skip
    return (
        "\n".join(
            [
                f"FROM {parent} AS {INSTALL_STAGE}",
                *preamble,
                f"LABEL {LABEL_PREFIX}.build-stage={INSTALL_STAGE}",
                f"COPY {runtime_zip.FILE_NAME} {SHARE}/{runtime_zip.FILE_NAME}",
                f"COPY netrc {SHARE}/netrc",
                *steps,
                f"RUN {json.dumps(installer)}",
                f"FROM {parent}",
                *preamble,
                f"COPY --from={INSTALL_STAGE} {DEPS_DIR} {DEPS_DIR}",
                f"ENV PYTHONPATH={DEPS_DIR}${{PYTHONPATH:+:$PYTHONPATH}} PATH={DEPS_DIR}/bin:$PATH",
            ]
        )
        + "\n"
    )


@functools.cache
def _uv_version() -> str:
    return importlib.metadata.version("uv")


def _file_fingerprint(path: Path) -> dict[str, object]:
    if path.is_dir():
        return {
            entry.name: [entry.stat().st_size, entry.stat().st_mtime_ns]
            for entry in sorted(path.iterdir())
            if entry.is_file()
        }
    return {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def derived_image_spec(
    parent: str, image: ImageSettings, options: BuildOptions, *, uv_binary: str | None
) -> DerivedImageSpec:
    """Describe the derived image of ``image`` over ``parent``, reading the worker files it copies in.

    :param uv_binary: the worker's uv binary to copy in; ``None`` pip-installs uv in the image instead

    :raises InvalidSettingError: when the CA bundle or a local ``find_links`` directory does not exist
    """
    files: list[tuple[str, str]] = []
    find_links: list[str] = []
    wheel_dirs: list[str] = []
    for link in image.find_links:
        directory = _local_directory(link)
        if directory is None:
            find_links.append(link)
            continue
        if not os.path.isdir(directory):
            raise InvalidSettingError(
                "ImageSettings", "find_links", link, "no such directory on the worker", "an existing wheel directory"
            )
        name = f"find-links-{len(wheel_dirs)}"
        files.append((name, directory))
        wheel_dirs.append(name)
        find_links.append(f"{SHARE}/{name}")
    if options.ca_bundle:
        if not os.path.isfile(options.ca_bundle):
            raise InvalidSettingError(
                "docker backend", "ca_bundle", options.ca_bundle, "no such file on the worker", "a PEM file path"
            )
        files.append(("ca-bundle.pem", options.ca_bundle))
    uv_source: UvSource | None = None
    if image.python_package_installer == "uv":
        uv_source = "worker" if uv_binary else "pip"
    netrc = split_credentials(image.installer_index_args())[1]
    labels = {
        f"{LABEL_PREFIX}.derived": "true",
        f"{LABEL_PREFIX}.parent": parent,
        f"{LABEL_PREFIX}.requirements-hash": image.requirements_hash,
        f"{LABEL_PREFIX}.installer": image.python_package_installer,
        f"{LABEL_PREFIX}.runtime": RUNTIME_VERSION,
    }
    dockerfile = render_dockerfile(
        parent,
        image,
        uv_source=uv_source,
        uv_version=_uv_version(),
        ca_bundle=bool(options.ca_bundle),
        find_links=find_links,
        wheel_dirs=wheel_dirs,
        labels=labels,
        compile_bytecode=options.compile_bytecode,
        credentials=bool(netrc),
    )
    fingerprint = json.dumps(
        {
            "dockerfile": dockerfile,
            "files": {
                **{name: _file_fingerprint(Path(path)) for name, path in files},
                **({runtime_zip.FILE_NAME: {"sha256": runtime_zip.digest()}} if netrc else {}),
            },
            "runtime": RUNTIME_VERSION,
        },
        sort_keys=True,
    )
    return DerivedImageSpec(
        parent,
        dockerfile,
        options.image_name,
        tuple(files),
        fingerprint,
        uv_binary if uv_source == "worker" else None,
        netrc,
        runtime=bool(netrc),
    )
