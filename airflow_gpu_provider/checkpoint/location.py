"""Where a task's checkpoints live, decided once: the same folder for every try of a task in a DAG run.

A root is an absolute local path or an object-storage URI (an fsspec scheme, as Airflow's ``ObjectStoragePath``):
the task's ``checkpoint=``, else ``[gpu] checkpoint_root``, else ``<[gpu] state_dir>/checkpoints``. ``False``
gives the task none. Under the root, a task try's folder is ``<dag_id>/<run_id>/<task_id>`` (``~map<i>`` appended
for a mapped task), each part made path-safe by :func:`path_segment`, which is injective: two different run ids
never share a folder. The backends show the folder to the task as ``AIRFLOW_GPU_CHECKPOINT_DIR``: the local path
(local), a bind mount (Docker), a PersistentVolumeClaim's subPath (Kubernetes), or the URI itself.

Pure: nothing here touches a file system.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from airflow_gpu_provider.exceptions import GpuTaskError, InvalidSettingError
from airflow_gpu_provider.runtime import protocol

if TYPE_CHECKING:
    from airflow_gpu_provider.config.worker import GpuConfig

# Object stores that a retry on another host or pod can reach (each is a key of fsspec's known_implementations).
URI_SCHEMES: tuple[str, ...] = (
    "s3", "s3a", "gs", "gcs", "az", "abfs", "adl", "hdfs", "webhdfs", "oss", "oci", "sftp", "ssh", "smb", "ftp",
    "webdav", "dbfs", "lakefs", "hf", "file",
)  # fmt: skip
CHECKPOINT_MOUNT = "/airflow-gpu-checkpoint"  # where Docker and Kubernetes mount a task's folder in its container
_SAFE = re.compile(r"[A-Za-z0-9_.-]")
_MAX_SEGMENT = 200  # bytes of a folder name (file systems allow 255)
_ACCEPTED = "an absolute local path ('/data/ckpt'), a URI such as 's3://bucket/ckpt', or False for none"


class CheckpointLocation(NamedTuple):
    """A task's checkpoint folder: ``root`` (a local path or a URI) and the folder under it.

    :param relative: ``<dag_id>/<run_id>/<task_id>[~map<i>]``, path-safe
    """

    root: str
    relative: str

    @property
    def is_uri(self) -> bool:
        """Whether the root is an object-storage URI (else a local path)."""
        return is_uri(self.root)

    @property
    def path(self) -> str:
        """The folder itself: a local path or a URI."""
        return join(self.root, self.relative)

    @property
    def run_relative(self) -> str:
        """``<dag_id>/<run_id>``: the run's folder under the root (the provider's marker lies there)."""
        return self.relative.rsplit("/", 1)[0]

    def make(self, labels: Mapping[str, str]) -> str:
        """Make the folder on this worker, private to it, its run folder marked as the provider's.

        A path (or ``file://``) root: the folders themselves; an object store's: the run folder's marker only.
        """
        from airflow_gpu_provider.policy.checkpoints import make_folder  # the worker's, when a try starts

        return make_folder(self.root, self.run_relative, self.relative.rsplit("/", 1)[1], labels)


def is_template(value: str) -> bool:
    """Whether a root is a Jinja template, checked when the task starts."""
    return "{{" in value or "{%" in value


def is_uri(root: str) -> bool:
    """Whether ``root`` is a URI (``scheme://...``) rather than a local path."""
    return "://" in root


def join(root: str, relative: str) -> str:
    """``relative`` under ``root`` (a path or a URI), with exactly one ``/`` between them."""
    return f"{root.rstrip('/')}/{relative}"


def check_root(owner: str, field: str, value: object) -> str | bool | None:
    """A checkpoint root as given: ``None`` (the default), ``False`` (none), a template, or a checked path or URI.

    :raises InvalidSettingError: for a relative path, an unknown scheme, a URI without a location, or another type
    """
    if value is None or value is False:
        return value
    if isinstance(value, os.PathLike) or type(value).__name__ == "ObjectStoragePath":
        value = str(value)
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise InvalidSettingError(owner, field, value, "expected a path or URI", _ACCEPTED)
    if is_template(value):
        return value  # checked when rendered
    if is_uri(value):
        scheme, _, rest = value.partition("://")
        if scheme.lower() not in URI_SCHEMES:
            raise InvalidSettingError(
                owner, field, value, f"unknown storage scheme {scheme!r}", " or ".join(f"{s}://" for s in URI_SCHEMES)
            )
        if not rest.strip("/") and scheme.lower() != "file":
            raise InvalidSettingError(owner, field, value, "the URI names no bucket or folder", _ACCEPTED)
        from airflow_gpu_provider.policy.paths import UnsafePathError, root_parts  # a URI root only

        try:
            root_parts(value)  # compared by its components: no '..', empty or percent-encoded segment (rule F3)
        except UnsafePathError as err:
            raise InvalidSettingError(owner, field, value, err.problem, _ACCEPTED) from None
        return value
    if not value.startswith("/"):
        raise InvalidSettingError(
            owner, field, value, "a relative path means another folder on every worker", _ACCEPTED
        )
    return posixpath.normpath(value)


def default_root(conf: GpuConfig) -> str:
    """``[gpu] checkpoint_root``, else ``<[gpu] state_dir>/checkpoints``."""
    root = check_root("[gpu]", "checkpoint_root", conf.checkpoint_root or None)
    return str(root) if isinstance(root, str) else join(conf.state_dir, "checkpoints")


def path_segment(text: str) -> str:
    """``text`` as one folder name: ``[A-Za-z0-9_.-]`` kept, anything else ``~XX`` (hex of each UTF-8 byte).

    Injective, as ``~`` itself is escaped; a leading ``.`` is escaped too (no ``.``/``..``). A name longer than the
    file system allows keeps its start and ends with a hash of the whole.
    """
    escaped = "".join(char if _SAFE.fullmatch(char) else "".join(f"~{b:02X}" for b in char.encode()) for char in text)
    if escaped.startswith("."):
        escaped = "~2E" + escaped[1:]
    if len(escaped) > _MAX_SEGMENT:
        escaped = f"{escaped[: _MAX_SEGMENT - 18]}~~{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    return escaped or "~"


def run_folder(dag_id: str, run_id: str) -> str:
    """``<dag_id>/<run_id>`` under a root: what a successful run's cleanup removes."""
    return f"{path_segment(dag_id)}/{path_segment(run_id)}"


def location(root: str, labels: Mapping[str, str]) -> CheckpointLocation:
    """The folder of a task try under ``root``, from its labels (dag_id, run_id, task_id, map_index)."""
    task = path_segment(labels["task_id"])
    map_index = str(labels.get("map_index", "-1"))
    if map_index not in ("-1", ""):
        task += f"~map{int(map_index)}"  # '~m' never comes out of path_segment: no task id collides
    return CheckpointLocation(root, f"{run_folder(labels['dag_id'], labels['run_id'])}/{task}")


def task_location(
    owner: str, checkpoint: str | bool | None, labels: Mapping[str, str], conf: GpuConfig
) -> CheckpointLocation | None:
    """The checkpoint folder of a task try: its own root (rendered), else the default; ``None`` with ``False``.

    :raises PolicyError: for a root the deployment does not allow (``[gpu_policy] allowed_checkpoint_roots``)
    """
    from airflow_gpu_provider.policy import Policy
    from airflow_gpu_provider.policy.checkpoints import check_root as permitted

    root = check_root(owner, "checkpoint", checkpoint)
    if root is False:
        return None
    if isinstance(root, str):
        permitted(owner, "checkpoint", root, Policy.of(conf))  # rule F3
    return location(root if isinstance(root, str) else default_root(conf), labels)


def checkpoint_environment(folder: str | None) -> dict[str, str]:
    """``AIRFLOW_GPU_CHECKPOINT_DIR`` for the task: the folder as the task sees it (none without one)."""
    return {} if folder is None else {protocol.CHECKPOINT_ENV: folder}


def unreachable(name: str, location: CheckpointLocation, *, resume: bool, where: str, fix: str) -> str:
    """A path root that the task's process cannot reach (a remote Docker engine's host, a pod without a claim).

    The one rule for every backend: with ``resume=True`` it is an error (the retry would silently start afresh);
    otherwise the task runs without a folder, and the returned warning says so in its log.

    :param name: the task (``dag.task``), for the message
    :param where: where the task runs, in words ("on the remote Docker engine's host", "in a pod")
    :param fix: what makes the folder reachable there
    """
    problem = f"{name}: its checkpoint folder {location.path} is on the worker, which the task {where} cannot reach"
    if resume:
        raise GpuTaskError(f"{problem}, so resume=True could never find a checkpoint. {fix}.")
    return f"{problem}: the task runs without a checkpoint folder. {fix}."
