"""``backend_options`` of the Slurm backend: one typed, frozen dataclass, checked when the DAG is parsed.

The cluster's own facts (the submit host's ``slurm.conf`` or slurmrestd's URL and token, the shared folder, the
GRES types of the accelerators) are in an Airflow connection (``slurm_conn_id``, ``connection.py``); a task names
only which connection (other than ``slurm_default``: one ``[gpu_policy] allowed_clusters`` lists), where its job
goes (partition, account, QoS, reservation: each one ``[gpu_policy] allowed_objects`` lists) and who owns a requeue.
docs/slurm.md says what each becomes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from airflow_gpu_provider.backends.options import BackendOptions, BadOption, boolean, option, seconds, text
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.policy.slurm import DEFAULT_CONN_ID
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings

_NAME = re.compile(r"[A-Za-z0-9_][-A-Za-z0-9_.]{0,63}")
#: the options that name an object of the cluster, each a kind of the admin's allow-list
NAMED = ("partition", "account", "qos", "reservation")


def _name(value: Any) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise BadOption("not a Slurm name", "letters, digits, '_', '-' and '.', as sinfo and sacctmgr show them")
    return value


@dataclass(frozen=True)
class SlurmOptions(BackendOptions):
    """The Slurm backend's options.

    :param slurm_conn_id: the Airflow connection of type ``slurm`` that says how to reach the cluster (default
        ``slurm_default``)
    :param partition: the job's partition (``--partition``; default: the cluster's default partition)
    :param account: the account it is charged to (``--account``)
    :param qos: its quality of service (``--qos``)
    :param reservation: a reservation it runs in (``--reservation``)
    :param requeue: who runs the job again when it is preempted or its node fails: ``True`` (default) Slurm, which
        requeues the same job (the same id; this try follows it), ``False`` Airflow, whose next try (through
        ``GpuRetryPolicy``) submits a new job, off the failed node where another fits
    :param pending_timeout: seconds the job may wait for its resources before ``on_missing_gpu`` applies (default:
        the policy's, 300 s for ``fail`` and ``cpu``, ``[gpu] wait_timeout`` for ``wait``)
    :param kill_grace: seconds between SIGTERM and SIGKILL for what the task leaves running in its job (default
        ``[gpu] kill_grace``; Slurm's own ``KillWait`` bounds the job itself)
    """

    backend: ClassVar[str] = "slurm"

    slurm_conn_id: str = option(DEFAULT_CONN_ID, check=text)
    partition: str | None = option(check=_name)
    account: str | None = option(check=_name)
    qos: str | None = option(check=_name)
    reservation: str | None = option(check=_name)
    requeue: bool = option(True, check=boolean)
    pending_timeout: float | None = option(check=seconds)
    kill_grace: float | None = option(check=seconds)

    @property
    def cluster_names(self) -> dict[str, str]:
        """What the job names of the cluster (``partition``, ...), as the allow-list's kinds."""
        return {kind: str(getattr(self, kind)) for kind in NAMED if getattr(self, kind) is not None}

    def check(self, resources: ResourceSettings) -> None:
        """MIG slices are not GRES here (a site that has them names them as GRES types: ``accelerator``)."""
        if resources.mig_profile is not None:
            raise InvalidSettingError(
                "ResourceSettings",
                "mig_profile",
                resources.mig_profile,
                "the Slurm backend asks for whole GPUs as GRES (a MIG slice is a GRES type of its own there)",
                "no mig_profile; accelerator= naming the slice's GRES type in the connection's accelerators map",
            )

    def check_image(self, image: ImageSettings) -> None:
        """No container and no index credentials: the job runs on the node's Python, its files on a shared folder."""
        if image.parent_image is not None:
            raise InvalidSettingError(
                "ImageSettings",
                "parent_image",
                image.parent_image,
                "the Slurm backend runs the task with the nodes' own Python; containers (Pyxis/enroot, Apptainer) "
                "are not supported",
                "no parent_image: requirements= installs into a cached folder on the cluster's shared folder",
            )
        if image.index_credentials:
            raise InvalidSettingError(
                "ImageSettings",
                "index_url",
                "(a URL with credentials)",
                "on the Slurm backend the requirements are installed by the job from its script, which the "
                "controller keeps and the cluster's admins read: a credential there would be disclosed",
                "the index's URL without credentials, and the credentials on the nodes (pip's or uv's own "
                "configuration, a netrc file of the job's user): docs/slurm.md",
            )

    def permitted(self, owner: str) -> None:
        """At DAG parse: the cluster, and each partition, account, QoS and reservation named, must be listed."""
        if self.cluster_names or self.slurm_conn_id != DEFAULT_CONN_ID:
            from airflow_gpu_provider.policy import Policy
            from airflow_gpu_provider.policy.slurm import check_cluster, check_names

            policy = Policy.current()
            check_cluster(owner, self.slurm_conn_id, policy)
            check_names(owner, self.cluster_names, policy)
