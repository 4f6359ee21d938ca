"""A derived image's recipe (pure): the install container's commands and environment, and what the image adds.

No Dockerfile and no engine build: ``POST /build`` takes a form and a build context that the engine's authorization
plugin cannot judge whole. A derived image is an install container's work, committed (``engine.py``), through calls
the plugin judges like any other. Without index credentials the install container installs into the image itself and
is committed: what it was given (uv, the CA bundle, the wheel folders) and what it installed stay in the image, as a
Dockerfile's ``COPY`` and ``RUN`` steps left them. With them, no committed layer may see the credentials (rule B2,
docs/security.md): the runtime's installer installs into :data:`DEPS_DIR` with the credentials in a netrc file beside
it, that container is removed, and what it installed goes into a container of the parent image that never runs,
which is committed (``installed``).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from airflow_gpu_provider.backends.docker.options import UvSource
from airflow_gpu_provider.runtime.protocol import INSTALL, split_credentials, uv_ca_variable
from airflow_gpu_provider.settings import ImageSettings
from airflow_gpu_provider.task import runtime_zip

SHARE = "/usr/local/share/airflow-gpu"
CA_PATH = f"{SHARE}/ca-bundle.pem"
UV_PATH = "/usr/local/bin/uv"  # the worker's uv, in the image
DEPS_DIR = "/opt/airflow-gpu/site-packages"  # where an install container installs (as Kubernetes init containers do)
BUILD_DIR = "/airflow-gpu-build"  # the install container's inputs: the runtime, uv, the netrc, CA bundle, wheels
PIP_ENVIRONMENT = {
    "PIP_BREAK_SYSTEM_PACKAGES": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_ROOT_USER_ACTION": "ignore",
}  # fmt: skip
#: Variables of the image that extend the parent's (``$NAME`` in a value: the parent's, as a Dockerfile's ``ENV``)
EXTENDED = ("PATH", "PYTHONPATH")


@dataclass(frozen=True)
class Recipe:
    """How the install container makes a derived image.

    :param commands: its commands, in order (one entrypoint: :meth:`entrypoint`)
    :param install_environment: its environment
    :param environment: what the image's environment adds to its parent's (:func:`image_environment`)
    :param installed: it installs into :data:`DEPS_DIR` and is never committed (index credentials)
    """

    commands: tuple[tuple[str, ...], ...]
    install_environment: tuple[tuple[str, str], ...]
    environment: tuple[tuple[str, str], ...]
    installed: bool = False

    def entrypoint(self) -> list[str]:
        """The install container's entrypoint: the command, or the commands one after the other (``sh -c``)."""
        if len(self.commands) == 1:
            return list(self.commands[0])
        return ["/bin/sh", "-c", " && ".join(shlex.join(command) for command in self.commands)]

    def text(self) -> str:
        """The recipe as text: what the log shows and the tag hashes."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


def ca_environment(path: str) -> dict[str, str]:
    """The variables that make pip, requests and Python trust the CA bundle at ``path``."""
    return {"SSL_CERT_FILE": path, "REQUESTS_CA_BUNDLE": path, "PIP_CERT": path}


def _installer_environment(uv_source: UvSource | None, uv_version: str) -> dict[str, str]:
    environment = dict(PIP_ENVIRONMENT)
    if uv_source is not None:  # uv trusts the image's CA store like pip does, not only its bundled roots
        environment[uv_ca_variable(uv_version)] = "1"
    return environment


def image_environment(
    *, uv_source: UvSource | None, uv_version: str, ca_bundle: bool, installed: bool
) -> dict[str, str]:
    """What a derived image's environment adds to its parent's: the CA bundle, pip's and uv's settings, DEPS_DIR."""
    environment = {**(ca_environment(CA_PATH) if ca_bundle else {}), **_installer_environment(uv_source, uv_version)}
    if installed:
        environment.update({"PYTHONPATH": f"{DEPS_DIR}:$PYTHONPATH", "PATH": f"{DEPS_DIR}/bin:$PATH"})
    return environment


def extended(parent: Sequence[str], additions: Mapping[str, str]) -> list[str]:
    """The image's ``Env``: the parent's ``NAME=value`` list with ``additions`` set (``$PATH``: the parent's value)."""
    values = dict(entry.partition("=")[::2] for entry in parent)
    for name, value in additions.items():
        own = value.removesuffix(f":${name}")
        values[name] = own + (f":{values[name]}" if values.get(name) else "") if name in EXTENDED else value
    return [f"{name}={value}" for name, value in values.items()]


def install_commands(
    image: ImageSettings,
    *,
    uv_source: UvSource | None,
    uv_version: str,
    find_links: Sequence[str],
    compile_bytecode: bool = True,
    on_base: bool = False,
) -> list[list[str]]:
    """The install container's commands without index credentials: the requirements into the image's Python.

    :param uv_source: where uv comes from (``worker``: :data:`UV_PATH`; ``pip``: pip-installed first), ``None``
        when the installer is pip
    :param find_links: ``--find-links`` values as the install container sees them
    :param compile_bytecode: compile ``.pyc`` files (pip's default; uv's ``--compile-bytecode``), so that tasks do
        not compile what they import in every fresh container
    :param on_base: on a derived image of the same recipe (``reuse.py``), which has uv already
    """
    index_args = split_credentials(dataclasses.replace(image, find_links=tuple(find_links)).installer_index_args())[0]
    pip = ["python3", "-m", "pip", "install", "--no-cache-dir"]
    commands = []
    if uv_source == "pip" and not on_base:
        commands.append([*pip, f"uv=={uv_version}"])
    if uv_source is None:
        installer = pip if compile_bytecode else [*pip, "--no-compile"]
    else:
        uv = [UV_PATH] if uv_source == "worker" else ["python3", "-m", "uv"]
        installer = [*uv, "pip", "install", "--system", "--break-system-packages", "--no-cache"]
        installer += ["--python", "python3", *(["--compile-bytecode"] if compile_bytecode else [])]
    commands.append([*installer, *index_args, *image.requirements])
    return commands


def credentialed_commands(
    image: ImageSettings,
    *,
    uv_source: UvSource | None,
    uv_version: str,
    find_links: Sequence[str],
    compile_bytecode: bool = True,
) -> list[list[str]]:
    """The install container's commands when the index needs credentials: the runtime's installer into DEPS_DIR.

    Only what the parent image lacks is installed (as Kubernetes init containers do); the credentials come in the
    netrc file named by ``NETRC`` (:func:`install_environment`), never in the arguments.

    :param find_links: ``--find-links`` values as the install container sees them (:data:`BUILD_DIR`)
    """
    index_args = split_credentials(dataclasses.replace(image, find_links=tuple(find_links)).installer_index_args())[0]
    uv = {"worker": ["--uv", f"{BUILD_DIR}/uv"], "pip": ["--uv-version", uv_version], None: []}[uv_source]
    runtime = f"{BUILD_DIR}/{runtime_zip.FILE_NAME}"
    install = [
        "python3", runtime, INSTALL, *uv, DEPS_DIR, image.python_package_installer, *index_args, "--",
        *image.requirements,
    ]  # fmt: skip
    return [install, *([["python3", "-m", "compileall", "-q", DEPS_DIR]] if compile_bytecode else [])]


def install_environment(*, uv_source: UvSource | None, uv_version: str, ca_bundle: bool) -> dict[str, str]:
    """The credentialed install container's environment: the netrc file's path, the CA bundle, pip's and uv's."""
    environment = {"NETRC": f"{BUILD_DIR}/netrc", **_installer_environment(uv_source, uv_version)}
    if ca_bundle:
        environment.update(ca_environment(f"{BUILD_DIR}/ca-bundle.pem"))
    return environment
