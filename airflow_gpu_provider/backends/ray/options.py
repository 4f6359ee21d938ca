"""``backend_options`` of the Ray backend: one typed, frozen dataclass, checked when the DAG is parsed (no ``ray``).

Every option is documented in ``docs/ray.md``. The cluster is reached through its Jobs API (the dashboard's address):
``ray_conn_id`` (an Airflow connection of type ``ray``, as the Apache Ray provider's hook reads it) or ``address``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from airflow_gpu_provider.backends.options import BackendOptions, BadOption, option, seconds, text
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings

#: the node label Ray gives a node from its GPUs' model (``ray.io/accelerator-type``: ``A100``, ``H100``, ...)
ACCELERATOR_LABEL = "ray.io/accelerator-type"
#: Ray's resource for each vendor's devices (docs.ray.io, "Accelerator Support"); NVIDIA, AMD, Intel: ``GPU``
VENDOR_RESOURCES = {"aws-neuron": "neuron_cores", "google-tpu": "TPU"}
_LABEL_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"!?(in|!in)?\(?[-A-Za-z0-9_., ]{0,200}\)?")
_ADDRESS = re.compile(r"(https?|ray)://[^\s/]+(/\S*)?")


def _address(value: Any) -> str:
    if not isinstance(value, str) or not _ADDRESS.fullmatch(value.strip()):
        raise BadOption("not a Ray address", "the Jobs API's URL, e.g. 'http://ray-head:8265'")
    return value.strip().rstrip("/")


def _label_selector(value: Any) -> dict[str, str]:
    accepted = "a dict of node label keys to values, as Ray's label_selector: {'market-type': 'on-demand'}"
    if not isinstance(value, Mapping) or not value:
        raise BadOption("expected a non-empty dict", accepted)
    for key, wanted in value.items():
        if not isinstance(key, str) or not _LABEL_KEY.fullmatch(key):
            raise BadOption("not a node label key", accepted, value=key)
        if not isinstance(wanted, str) or not _LABEL_VALUE.fullmatch(wanted):
            raise BadOption("not a label value or selector ('v', '!v', 'in(a,b)', '!in(a,b)')", accepted, value=wanted)
    return dict(value)


def _label_key(value: Any) -> str:
    if not isinstance(value, str) or not _LABEL_KEY.fullmatch(value):
        raise BadOption("not a node label key", f"a label key such as {ACCELERATOR_LABEL!r}")
    return value


def ray_accelerator_type(model: str) -> str:
    """The value Ray's ``ray.io/accelerator-type`` label has for a model: ``A100-80GB`` -> ``A100``.

    Ray names a node's GPUs by model alone (``ray.util.accelerators``), without their memory.
    """
    return re.sub(r"-\d+GB$", "", model.strip(), flags=re.IGNORECASE).upper()


@dataclass(frozen=True)
class RayOptions(BackendOptions):
    """The Ray backend's options.

    :param ray_conn_id: an Airflow connection of type ``ray``: its extra ``address`` is the Jobs API's URL (the
        dashboard, ``http://head:8265``), its password the cluster's token; ``headers``, ``cookies`` and ``verify``
        reach the client (the fields of the Apache Ray provider's ``RayHook``)
    :param address: the Jobs API's URL, instead of a connection: ``ray_default``'s or one of ``[gpu]
        allowed_clusters`` (``ray=ADDRESS``), checked at parse
    :param label_selector: node labels the task's job must run on (Ray's ``entrypoint_label_selector``; with
        several machines, each bundle's ``bundle_label_selector``)
    :param accelerator_label: the node label that names a node's GPU model, which ``accelerator`` selects on
        (default Ray's own ``ray.io/accelerator-type``; a KubeRay cluster may set its own)
    :param pending_timeout: seconds a job may wait for the cluster's GPUs before ``on_missing_gpu`` applies (default:
        the policy's, 300 s for ``fail`` and ``cpu``, ``[gpu] wait_timeout`` for ``wait``)
    :param kill_grace: seconds between SIGTERM and SIGKILL when the job is stopped (default ``[gpu] kill_grace``)
    """

    backend: ClassVar[str] = "ray"

    ray_conn_id: str | None = option(check=text)
    address: str | None = option(check=_address)
    label_selector: dict[str, str] | None = option(check=_label_selector)
    accelerator_label: str = option(ACCELERATOR_LABEL, check=_label_key)
    pending_timeout: float | None = option(check=seconds)
    kill_grace: float | None = option(check=seconds)

    def __post_init__(self) -> None:
        if self.ray_conn_id is not None and self.address is not None:
            raise self.invalid(
                "address", self.address, "ray_conn_id names the cluster already", "ray_conn_id or address, not both"
            )

    def permitted(self, owner: str) -> None:
        """At DAG parse: a literal ``address`` is the deployment's own cluster or one it lists (rule R1)."""
        if self.address is not None:
            from airflow_gpu_provider.backends.ray.connection import check_cluster

            check_cluster(owner, "backend_options['address']", self.address)

    def check(self, resources: ResourceSettings) -> None:
        """MIG slices and memory shares cannot be asked of Ray; a label selector must not contradict ``accelerator``."""
        if resources.gpu_share is not None:
            raise InvalidSettingError(
                "ResourceSettings", "gpu_share", resources.gpu_share,
                "Ray schedules fractions of a GPU (num_gpus), not amounts of its memory",
                "gpu_count=0.25 (a share of one GPU) on Ray",
            )  # fmt: skip
        if resources.mig_profile is not None:
            raise InvalidSettingError(
                "ResourceSettings",
                "mig_profile",
                resources.mig_profile,
                "Ray schedules whole GPUs or fractions of one, not MIG slices",
                "gpu_count=0.5 (a share of one GPU) or no mig_profile",
            )
        if resources.accelerator and self.accelerator_label in (self.label_selector or {}):
            raise self.invalid(
                "label_selector",
                self.label_selector,
                f"it selects on {self.accelerator_label!r}, which accelerator={resources.accelerator!r} sets",
                "the model in accelerator only",
            )

    def check_image(self, image: ImageSettings) -> None:
        """No index credentials: Ray keeps a job's runtime_env in its metadata, which every cluster user reads."""
        if image.index_credentials:
            raise InvalidSettingError(
                "ImageSettings",
                "index_url",
                "(a URL with credentials)",
                "on the Ray backend the requirements are installed by the cluster from the job's runtime_env, which "
                "every user of the cluster can read: a credential there would be disclosed",
                "the index's URL without credentials, and the credentials on the cluster's nodes (a netrc file of "
                "the user Ray runs as, or pip's and uv's own configuration): docs/ray.md",
            )
