"""A derived image's recipe, as text (pure): its Dockerfile, and the install container's command and environment.

Without index credentials the Dockerfile installs the requirements itself (one ``RUN``). With them, no build step
may see them: a layer keeps what its step wrote, a step's image stays in the build cache, and a build killed halfway
leaves its step images on the engine (rule B2, docs/security.md: no image layer ever holds a credential). The
requirements are then installed first in an install container from the parent image (the runtime's installer, the
credentials in a netrc file that the container gets beside it: ``install.py``); the Dockerfile only copies what it
installed (:data:`DEPS_DIR`) into the image.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence

from airflow_gpu_provider.backends.docker.options import UvSource
from airflow_gpu_provider.runtime.protocol import INSTALL, split_credentials, uv_ca_variable
from airflow_gpu_provider.settings import ImageSettings
from airflow_gpu_provider.task import runtime_zip

SHARE = "/usr/local/share/airflow-gpu"
CA_PATH = f"{SHARE}/ca-bundle.pem"
DEPS_DIR = "/opt/airflow-gpu/site-packages"  # where an install container installs (as Kubernetes init containers do)
BUILD_DIR = "/airflow-gpu-build"  # the install container's inputs: the runtime, uv, the netrc, CA bundle, wheels
DEPS = "deps"  # DEPS_DIR's files in the build context
PIP_ENVIRONMENT = {
    "PIP_BREAK_SYSTEM_PACKAGES": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_ROOT_USER_ACTION": "ignore",
}  # fmt: skip


def ca_environment(path: str) -> dict[str, str]:
    """The variables that make pip, requests and Python trust the CA bundle at ``path``."""
    return {"SSL_CERT_FILE": path, "REQUESTS_CA_BUNDLE": path, "PIP_CERT": path}


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
    installed: bool = False,
    on_base: bool = False,
) -> str:
    """The Dockerfile text.

    :param uv_source: where uv comes from, ``None`` when the installer is pip
    :param uv_version: the uv version to use (the worker's; ``uv_source="pip"`` installs the same one)
    :param find_links: ``--find-links`` values as the build sees them
    :param wheel_dirs: build-context directories copied to ``SHARE/<name>`` (local wheel directories)
    :param compile_bytecode: compile ``.pyc`` files in the image (pip's default; uv's ``--compile-bytecode``), so
        that tasks do not compile what they import in every fresh container
    :param installed: an install container installed the requirements (the index needs credentials): the image is
        the parent plus its :data:`DEPS_DIR`, from the build context's ``deps`` folder
    :param on_base: the steps after ``FROM`` of a build on a derived image of the same recipe (``reuse.py``), which
        has the CA bundle, the variables, uv and the wheel folders already: the labels and the install alone
    """
    labelled = [_label_line(labels)] if labels else []  # first: the build's intermediate containers carry them too
    preamble = list(labelled)
    if ca_bundle:
        preamble += [f"COPY ca-bundle.pem {CA_PATH}", "ENV " + _variables(ca_environment(CA_PATH))]
    environment = dict(PIP_ENVIRONMENT)
    if uv_source is not None:  # uv trusts the image's CA store like pip does, not only its bundled roots
        environment[uv_ca_variable(uv_version)] = "1"
    preamble.append("ENV " + _variables(environment))
    if installed:
        return "\n".join([f"FROM {parent}", *preamble, *_copy_installed(compile_bytecode)]) + "\n"
    index_args = split_credentials(dataclasses.replace(image, find_links=tuple(find_links)).installer_index_args())[0]
    pip = ["python3", "-m", "pip", "install", "--no-cache-dir"]
    steps = []
    if uv_source == "worker":
        steps.append("COPY uv /usr/local/bin/uv")
    elif uv_source == "pip":
        steps.append(f"RUN {json.dumps([*pip, f'uv=={uv_version}'])}")
    steps += [f"COPY {name} {SHARE}/{name}" for name in wheel_dirs]
    if uv_source is None:
        installer = pip if compile_bytecode else [*pip, "--no-compile"]
    else:
        uv = "/usr/local/bin/uv" if uv_source == "worker" else "python3 -m uv"
        installer = [*uv.split(), "pip", "install", "--system", "--break-system-packages", "--no-cache"]
        installer += ["--python", "python3", *(["--compile-bytecode"] if compile_bytecode else [])]
    install = f"RUN {json.dumps([*installer, *index_args, *image.requirements])}"
    if on_base:
        return "\n".join([*labelled, install]) + "\n"
    return "\n".join([f"FROM {parent}", *preamble, *steps, install]) + "\n"


def _label_line(labels: Mapping[str, str]) -> str:
    return "LABEL " + " ".join(f"{key}={json.dumps(value)}" for key, value in sorted(labels.items()))


def _variables(values: Mapping[str, str]) -> str:
    return " ".join(f"{name}={value}" for name, value in values.items())


def _copy_installed(compile_bytecode: bool) -> list[str]:
    steps = [
        f"COPY {DEPS} {DEPS_DIR}",
        f"ENV PYTHONPATH={DEPS_DIR}${{PYTHONPATH:+:$PYTHONPATH}} PATH={DEPS_DIR}/bin:$PATH",
    ]
    if compile_bytecode:
        steps.append(f"RUN {json.dumps(['python3', '-m', 'compileall', '-q', DEPS_DIR])}")
    return steps


def install_command(
    image: ImageSettings, *, uv_source: UvSource | None, uv_version: str, find_links: Sequence[str]
) -> list[str]:
    """The install container's command: the runtime's installer, into :data:`DEPS_DIR`, with no credential.

    Only what the parent image lacks is installed (as Kubernetes init containers do); the credentials come in the
    netrc file named by ``NETRC`` (:func:`install_environment`).

    :param find_links: ``--find-links`` values as the install container sees them (:data:`BUILD_DIR`)
    """
    index_args = split_credentials(dataclasses.replace(image, find_links=tuple(find_links)).installer_index_args())[0]
    uv = {"worker": ["--uv", f"{BUILD_DIR}/uv"], "pip": ["--uv-version", uv_version], None: []}[uv_source]
    runtime = f"{BUILD_DIR}/{runtime_zip.FILE_NAME}"
    return [
        "python3", runtime, INSTALL, *uv, DEPS_DIR, image.python_package_installer, *index_args, "--",
        *image.requirements,
    ]  # fmt: skip


def install_environment(*, uv_source: UvSource | None, uv_version: str, ca_bundle: bool) -> dict[str, str]:
    """The install container's environment: the netrc file's path, the CA bundle, pip's and uv's settings."""
    environment = {"NETRC": f"{BUILD_DIR}/netrc", **PIP_ENVIRONMENT}
    if uv_source is not None:
        environment[uv_ca_variable(uv_version)] = "1"
    if ca_bundle:
        environment.update(ca_environment(f"{BUILD_DIR}/ca-bundle.pem"))
    return environment


def with_labels(dockerfile: str, labels: Mapping[str, str]) -> str:
    """``dockerfile`` with ``labels`` set right after ``FROM``: every step's container and image carries them.

    The builder's identity goes in this way, when the build starts: not part of the content hash.
    """
    first, rest = dockerfile.split("\n", 1)
    return f"{first}\n{_label_line(labels)}\n{rest}"
