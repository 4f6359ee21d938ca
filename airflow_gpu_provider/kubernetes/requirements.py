"""Injected requirements on Kubernetes, with no registry: an init container installs them into an ``emptyDir``.

``requirements_mode="init-container"`` (default): an init container runs the task's own image (so the same Python
and the same preinstalled packages, e.g. torch) and installs into ``DEPS_DIR`` only what the image lacks: uv resolves
the requirements against the image's environment (``--dry-run``), then installs exactly the missing pins with
``--no-deps``, so ``accelerate`` never drags in a second multi-GB torch. The main container mounts the directory
read-only and finds it on ``PYTHONPATH``. uv comes from the image if it has one, otherwise from PyPI (pip).

``requirements_mode="image"``: run ``backend_options["derived_image"]``, e.g. the image the Docker backend built and
pushed to your registry; nothing is installed at run time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_gpu_provider.settings import ImageSettings

DEPS_VOLUME = "gpu-deps"
DEPS_DIR = "/opt/airflow-gpu/site-packages"
INIT_CONTAINER = "install-requirements"

# Stdlib only; argv: TARGET INSTALLER [INDEX ARGS...] -- REQUIREMENTS...  (no shell: arguments stay arguments)
INSTALL_SCRIPT = """\
import os, shutil, subprocess, sys
target, installer, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
index_args, requirements = rest[: rest.index("--")], rest[rest.index("--") + 1 :]
env = dict(os.environ, UV_NATIVE_TLS=os.environ.get("UV_NATIVE_TLS", "1"))
def run(argv, **kwargs):
    print("[gpu] $ " + " ".join(argv), flush=True)
    return subprocess.run(argv, check=True, env=env, **kwargs)
if installer == "pip":
    run([sys.executable, "-m", "pip", "install", "--no-cache-dir", "--target", target, *index_args, *requirements])
    sys.exit(0)
uv = shutil.which("uv")
if uv is None:
    run([sys.executable, "-m", "pip", "install", "--quiet", "--no-cache-dir", "--target", "/tmp/airflow-gpu-uv", "uv"])
    uv = "/tmp/airflow-gpu-uv/bin/uv"
python = ["--python", sys.executable]
plan = run([uv, "pip", "install", "--dry-run", "--break-system-packages", *python, *index_args, *requirements],
           capture_output=True, text=True)
pins = [line.strip()[2:] for line in (plan.stdout + plan.stderr).splitlines() if line.strip().startswith("+ ")]
if not pins:
    print("[gpu] the image already satisfies every requirement", flush=True)
    sys.exit(0)
run([uv, "pip", "install", "--no-deps", "--target", target, *python, *index_args, *pins])
"""


@dataclass(frozen=True)
class RequirementsPlan:
    """What the pod needs for the task's requirements.

    :param image: the main container's image
    :param init_containers: containers that install the requirements (API dicts)
    :param volumes: volumes they share with the main container
    :param volume_mounts: the main container's mounts
    :param environment: the main container's extra environment
    """

    image: str
    init_containers: list[dict[str, Any]] = field(default_factory=list)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    volume_mounts: list[dict[str, Any]] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)


def requirements_plan(
    image: ImageSettings,
    *,
    mode: str,
    base_image: str,
    derived_image: str | None,
    installer_image: str | None,
    security_context: dict[str, Any],
    resources: dict[str, dict[str, str]],
) -> RequirementsPlan:
    """The init container, volume and environment for ``image.requirements`` (nothing when there are none).

    :param base_image: ``image.parent_image`` or ``[gpu] default_parent_image``
    :param resources: cpu/memory requests and limits for the init container
    """
    if mode == "image":
        return RequirementsPlan(image=derived_image or base_image)
    if not image.requirements:
        return RequirementsPlan(image=base_image)
    init = {
        "name": INIT_CONTAINER,
        "image": installer_image or base_image,
        "command": ["python3", "-c", INSTALL_SCRIPT],
        "args": [
            DEPS_DIR,
            image.python_package_installer,
            *image.installer_index_args(),
            "--",
            *image.requirements,
        ],
        "env": [
            {"name": "UV_NATIVE_TLS", "value": "1"},  # the image's CA store (TLS-intercepting proxies)
            {"name": "UV_LINK_MODE", "value": "copy"},
            {"name": "HOME", "value": "/tmp"},
            {"name": "PIP_DISABLE_PIP_VERSION_CHECK", "value": "1"},
        ],
        "volumeMounts": [{"name": DEPS_VOLUME, "mountPath": DEPS_DIR}],
        "securityContext": dict(security_context),
        "resources": resources,
    }
    return RequirementsPlan(
        image=base_image,
        init_containers=[init],
        volumes=[{"name": DEPS_VOLUME, "emptyDir": {}}],
        volume_mounts=[{"name": DEPS_VOLUME, "mountPath": DEPS_DIR, "readOnly": True}],
        environment={"PYTHONPATH": DEPS_DIR},
    )
