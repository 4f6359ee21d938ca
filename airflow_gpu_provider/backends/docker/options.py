"""``backend_options`` of the Docker backend: one typed, frozen dataclass, checked when the DAG is parsed."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from airflow_gpu_provider.backends.options import (
    BackendOptions,
    BadOption,
    boolean,
    dict_list,
    one_of,
    option,
    seconds,
    string_list,
    text,
)
from airflow_gpu_provider.checkpoint.location import CHECKPOINT_MOUNT
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.policy.build import check_image_inputs
from airflow_gpu_provider.settings import AMD, INTEL, NVIDIA, ImageSettings, ResourceSettings
from airflow_gpu_provider.task.environment import DRIVER_CAPABILITIES

PullPolicy = Literal["missing", "always", "never"]
AutoRemove = Literal["force", "success", "never"]
UvSource = Literal["worker", "pip"]
PULL_POLICIES: tuple[str, ...] = ("missing", "always", "never")
AUTO_REMOVE: tuple[str, ...] = ("force", "success", "never")
UV_SOURCES: tuple[str, ...] = ("worker", "pip")
MOUNT_TYPES: tuple[str, ...] = ("bind", "volume", "tmpfs")
MOUNT_KEYS = frozenset({"source", "target", "type", "read_only"})
DEFAULT_DOCKER_URL = "unix://var/run/docker.sock"
CONTAINER_DIR = "/airflow-gpu"  # the runtime and the envelope, mounted read-only (or copied in): no mount goes there
SUPPORTED_VENDORS: tuple[str, ...] = (NVIDIA.name, AMD.name, INTEL.name)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _docker_url(value: Any) -> str | tuple[str, ...]:
    urls = value if isinstance(value, (list, tuple)) else [value]
    for url in urls:
        text(url)
    return value if isinstance(value, str) else tuple(value)


def _user(value: Any) -> str | int:
    if not isinstance(value, (str, int)) or isinstance(value, bool) or not str(value).strip():
        raise BadOption("expected a user name or uid", "'ml', 1000 or '1000:1000' (a user of the worker host)")
    return value


def _absolute_path(value: Any) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "\x00" in value:
        raise BadOption("Docker needs an absolute path in the container", "a path such as '/workspace'")
    return value


def _capabilities(value: Any) -> tuple[str, ...]:
    names = string_list(value)
    for name in names:
        if not name.isascii() or not name.replace("_", "").isalnum() or not name.isupper():
            raise BadOption("not a Linux capability name", "names such as ['SYS_PTRACE', 'IPC_LOCK']", value=name)
    return names


def _container_path(path: str) -> str:
    """A path as the engine compares mount targets: ``//data/`` and ``/data/x/..`` are ``/data``."""
    return "/" + posixpath.normpath(path).lstrip("/")


def _mounts(value: Any) -> tuple[dict[str, Any], ...]:
    accepted = "a list of {'source': ..., 'target': '/abs/path', 'type': 'bind'|'volume'|'tmpfs', 'read_only': bool}"
    mounts = dict_list(value, keys=MOUNT_KEYS, what="mount", accepted=accepted)
    targets: set[str] = set()
    for mount in mounts:
        target, kind, source = mount.get("target"), mount.get("type", "bind"), mount.get("source")
        if not isinstance(target, str) or not target.startswith("/") or "\x00" in target:
            raise BadOption("'target' must be an absolute path in the container", accepted, value=mount)
        path = _container_path(target)
        if path == "/" or _inside(path, CONTAINER_DIR) or _inside(path, CHECKPOINT_MOUNT):
            why = f"'target' must not be '/' nor the task's own {CONTAINER_DIR} or {CHECKPOINT_MOUNT}"
            raise BadOption(why, accepted, value=mount)
        if path in targets:
            raise BadOption(f"two mounts at {path!r}", accepted, value=mount)
        targets.add(path)
        if kind not in MOUNT_TYPES:
            raise BadOption(f"unknown mount type {kind!r}", accepted, value=mount)
        if not isinstance(mount.get("read_only", False), bool):
            raise BadOption("'read_only' must be True or False", accepted, value=mount)
        if kind == "tmpfs" and source is not None:
            raise BadOption("a tmpfs mount takes no 'source'", accepted, value=mount)
        if kind != "tmpfs" and (not isinstance(source, str) or not source or "\x00" in source):
            raise BadOption("'source' is required for bind and volume mounts", accepted, value=mount)
    return mounts


def check_gpu_request(resources: ResourceSettings, device_ids: Sequence[str]) -> None:
    """What Docker cannot give: another vendor's devices, MIG slices by profile, fewer device ids than GPUs.

    Asked at DAG parse time (:meth:`DockerOptions.check`) and again when the GPUs are mapped, on the devices the host
    allocator handed out.
    """
    if not resources.requests_gpus:
        return
    count, vendor = resources.gpu_count, resources.gpu_vendor
    if vendor.name not in SUPPORTED_VENDORS:
        raise InvalidSettingError(
            "backend 'docker'",
            "gpu_vendor",
            vendor.name,
            "the docker backend cannot expose these devices",
            ", ".join(SUPPORTED_VENDORS),
        )
    if device_ids and isinstance(count, int) and len(device_ids) < count:
        raise InvalidSettingError(
            "backend 'docker'", "devices", list(device_ids), f"fewer device ids than gpu_count={count}",
            f"at least {count} ids",
        )  # fmt: skip
    if vendor == NVIDIA and resources.mig_profile and not device_ids:
        raise InvalidSettingError(
            "backend 'docker'",
            "mig_profile",
            resources.mig_profile,
            "Docker requests GPUs by count and cannot pick MIG slices by profile",
            "backend_options={'devices': ['MIG-<uuid>', ...]} with the slices' UUIDs (nvidia-smi -L)",
        )


@dataclass(frozen=True)
class DockerOptions(BackendOptions):
    """The Docker backend's options; each default is written here once.

    :param docker_conn_id: Airflow Docker connection used to log in to a registry (pulls and pushes)
    :param docker_url: the engine, as for ``DockerOperator`` (default ``$DOCKER_HOST``, else the local socket); any
        other only from ``[gpu_policy] allowed_clusters``, with TLS from the worker's ``DOCKER_CERT_PATH``
    :param api_version: Docker API version
    :param timeout: API call timeout in seconds
    :param network_mode: ``bridge``, ``none``, ``host`` or a network name (default: the engine's)
    :param mounts: ``[{"source", "target", "type": "bind"|"volume"|"tmpfs", "read_only"}]``; bind sources beneath
        ``[gpu_policy] allowed_mount_roots`` and volumes of ``[gpu_policy] allowed_volumes`` only (``policy/docker.py``)
    :param ipc_mode: e.g. ``"host"`` to share the host's IPC namespace and ``/dev/shm``
    :param user: who the task runs as in the container: a user of the worker host (with its primary group there)
        or ``uid:gid``, always handed to the engine as numbers resolved on the worker (default: the worker's own
        uid:gid; others only from ``[gpu_policy] allowed_users``)
    :param working_dir: where the task runs in the container (default: the image's)
    :param auto_remove: ``force`` removes every container, ``success`` keeps failed ones (stopped) for
        inspection, ``never`` keeps all
    :param pull: pull the parent image when it is ``missing``, ``always`` or ``never``
    :param registry: push derived images there, and pull them from there first (default: the connection's extra)
    :param repository: image name of derived images
    :param ca_bundle: PEM file that installs inside derived-image builds trust (default: the connection's extra)
    :param uv_source: ``worker`` copies the worker's uv binary into the build; ``pip`` pip-installs uv
    :param compile_bytecode: compile ``.pyc`` files into derived images, so tasks do not compile what they import
        in every fresh container (costs build time once)
    :param devices: which of the host's GPUs the task may take, by index or UUID (MIG UUIDs as ``[gpu] devices``
        lists them): on a local engine it only narrows the host's GPUs, and still takes their locks and skips those
        quarantined
    :param driver_capabilities: ``NVIDIA_DRIVER_CAPABILITIES`` of GPU containers
    :param group_add: supplementary groups, names of the worker host or gids, handed to the engine as the worker
        host's gids (``[gpu_policy] allowed_groups``); AMD GPU tasks also get the host's ``video`` and ``render``
    :param mount_tmp_dir: share the task's files through a bind-mounted worker folder; ``False`` copies them
        through the Docker API (remote engines; tried by itself when the engine cannot see the folder)
    :param cap_add: Linux capabilities to keep (every one is dropped by default), e.g. ``["SYS_PTRACE"]`` for a
        profiler, ``["IPC_LOCK"]`` for RDMA
    :param stop_timeout: seconds between SIGTERM and SIGKILL when the task is stopped (default ``[gpu] kill_grace``)
    """

    backend: ClassVar[str] = "docker"
    removed: ClassVar[Mapping[str, str]] = {
        **BackendOptions.removed,
        **dict.fromkeys(
            ("tls_ca_cert", "tls_client_cert", "tls_client_key"),
            "TLS files are the worker's, never a path in a DAG: an engine of [gpu_policy] allowed_clusters is reached "
            "with the worker's (and triggerer's) DOCKER_CERT_PATH and DOCKER_TLS_VERIFY.",
        ),
    }

    docker_conn_id: str | None = option(check=text)
    docker_url: str | tuple[str, ...] | None = option(check=_docker_url)
    api_version: str = option("auto", check=text)
    timeout: float = option(60.0, check=seconds)
    network_mode: str | None = option(check=text)
    mounts: tuple[dict[str, Any], ...] = option((), check=_mounts)
    ipc_mode: str | None = option(check=text)
    user: str | int | None = option(check=_user)
    working_dir: str | None = option(check=_absolute_path)
    auto_remove: AutoRemove = option("force", check=one_of(*AUTO_REMOVE))
    pull: PullPolicy = option("missing", check=one_of(*PULL_POLICIES))
    registry: str | None = option(check=text)
    repository: str = option("airflow-gpu-derived", check=text)
    ca_bundle: str | None = option(check=text)
    uv_source: UvSource = option("worker", check=one_of(*UV_SOURCES))
    compile_bytecode: bool = option(True, check=boolean)
    devices: tuple[str, ...] = option((), check=string_list)
    driver_capabilities: str = option(DRIVER_CAPABILITIES, check=text)
    group_add: tuple[str, ...] | None = option(check=string_list)
    mount_tmp_dir: bool = option(True, check=boolean)
    cap_add: tuple[str, ...] = option((), check=_capabilities)
    stop_timeout: float | None = option(check=seconds)

    def check(self, resources: ResourceSettings) -> None:
        """At DAG parse time: GPUs that Docker cannot hand out with these options."""
        check_gpu_request(resources, self.devices)

    def permitted(self, owner: str) -> None:
        """At DAG parse time: what these options ask of the host, against the deployment's ``[gpu]`` allow-lists."""
        asks = self.mounts or self.cap_add or self.user is not None or self.group_add or self.network_mode
        if asks or self.ipc_mode or self.docker_url:  # the policy is read only for tasks that ask for something
            from airflow_gpu_provider.policy import Policy
            from airflow_gpu_provider.policy.docker import check_options

            check_options(owner, self, Policy.current())

    def check_image(self, image: ImageSettings) -> None:
        """At DAG parse time: the worker files a derived image's build would read (``policy/build.py``)."""
        check_image_inputs(image, self.ca_bundle)

    @property
    def engine_url(self) -> str | tuple[str, ...]:
        """The engine to talk to: ``docker_url``, else ``$DOCKER_HOST``, else the local socket (as DockerOperator)."""
        return self.docker_url or self.default_engine

    @property
    def default_engine(self) -> str:
        """The engine of this process: ``$DOCKER_HOST``, else the local socket."""
        return os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_URL

    @property
    def engines(self) -> tuple[str, ...]:
        """Every engine :attr:`engine_url` names (a list is tried in order)."""
        return (self.engine_url,) if isinstance(self.engine_url, str) else tuple(self.engine_url)

    @property
    def engine_is_local(self) -> bool:
        """Whether the engine is on this host (a unix socket), so that it shares this host's GPUs."""
        return isinstance(self.engine_url, str) and self.engine_url.startswith("unix://")
