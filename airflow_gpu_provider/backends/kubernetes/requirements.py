"""Injected requirements on Kubernetes, with no registry: an init container installs them into an ``emptyDir``.

``requirements_mode="init-container"`` (default): an init container runs the task's own image (so the same Python
and the same preinstalled packages, e.g. torch) and the runtime's installer
(``runtime.pyz install``, the one the local backend's venvs use too):
uv installs into ``DEPS_DIR`` only what the image lacks, so ``accelerate`` never drags in a second multi-GB torch.
The main container mounts the directory read-only and finds it on ``PYTHONPATH``. uv comes from the image if it has
one, otherwise from PyPI (pip).

``requirements_mode="image"``: run ``backend_options["derived_image"]``, e.g. the image the Docker backend built and
pushed to your registry; nothing is installed at run time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airflow_gpu_provider.backends.kubernetes.container import BOOTSTRAP_ENV, LAUNCHER, bootstrap_payload
from airflow_gpu_provider.runtime.protocol import INSTALL, split_credentials
from airflow_gpu_provider.settings import ImageSettings

DEPS_VOLUME = "gpu-deps"
DEPS_DIR = "/opt/airflow-gpu/site-packages"
INIT_CONTAINER = "install-requirements"
NETRC_VOLUME = "index-credentials"
NETRC_DIR = "/run/airflow-gpu/index"


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
    index_secret: str | None = None,
) -> RequirementsPlan:
    """The init container, volume and environment for ``image.requirements`` (nothing when there are none).

    :param base_image: ``image.parent_image`` or the connection's ``parent_image``
    :param resources: cpu/memory requests and limits for the init container
    :param index_secret: a Secret with a ``netrc`` file of the index credentials, mounted into the init container only
    """
    if mode == "image":
        return RequirementsPlan(image=derived_image or base_image)
    if not image.requirements:
        return RequirementsPlan(image=base_image)
    init: dict[str, Any] = {
        "name": INIT_CONTAINER,
        "image": installer_image or base_image,
        "command": ["python3", "-c", LAUNCHER],
        "args": [
            INSTALL,
            DEPS_DIR,
            image.python_package_installer,
            *split_credentials(image.installer_index_args())[0],  # never credentials in the pod spec
            "--",
            *image.requirements,
        ],
        "env": [
            {"name": BOOTSTRAP_ENV, "value": bootstrap_payload()},
            {"name": "UV_LINK_MODE", "value": "copy"},
            {"name": "HOME", "value": "/tmp"},
            {"name": "PIP_DISABLE_PIP_VERSION_CHECK", "value": "1"},
        ],
        "volumeMounts": [{"name": DEPS_VOLUME, "mountPath": DEPS_DIR}],
        "securityContext": dict(security_context),
        "resources": resources,
    }
    volumes: list[dict[str, Any]] = [{"name": DEPS_VOLUME, "emptyDir": {}}]
    if index_secret is not None:
        init["env"].append({"name": "NETRC", "value": f"{NETRC_DIR}/netrc"})
        init["volumeMounts"].append({"name": NETRC_VOLUME, "mountPath": NETRC_DIR, "readOnly": True})
        volumes.append(
            {"name": NETRC_VOLUME, "secret": {"secretName": index_secret, "items": [{"key": "netrc", "path": "netrc"}]}}
        )
    return RequirementsPlan(
        image=base_image,
        init_containers=[init],
        volumes=volumes,
        volume_mounts=[{"name": DEPS_VOLUME, "mountPath": DEPS_DIR, "readOnly": True}],
        environment={"PYTHONPATH": DEPS_DIR},
    )
