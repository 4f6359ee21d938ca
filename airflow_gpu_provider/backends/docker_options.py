"""``backend_options`` of the Docker backend: names, checks (at DAG parse time) and defaults.

Each option, with its default:

- ``docker_conn_id`` (None): Airflow Docker connection used to log in to a registry (pulls and pushes)
- ``docker_url`` (``$DOCKER_HOST`` or ``unix://var/run/docker.sock``): the engine, as for ``DockerOperator``
- ``api_version`` ("auto"), ``timeout`` (60): Docker API version and API call timeout in seconds
- ``tls_ca_cert``, ``tls_client_cert``, ``tls_client_key`` (None): TLS to a remote engine
- ``network_mode`` (engine default): ``bridge``, ``none``, ``host`` or a network name
- ``mounts`` (none): list of ``{"source", "target", "type": "bind"|"volume"|"tmpfs", "read_only"}``; the Docker
  socket (or a folder holding it) is refused
- ``ipc_mode`` (engine default): e.g. ``"host"`` to share the host's IPC namespace and ``/dev/shm``
- ``user``, ``working_dir`` (image defaults): who and where the task runs in the container
- ``auto_remove`` ("force"): ``force`` removes every container, ``success`` keeps failed ones (stopped) for
  inspection, ``never`` keeps all
- ``pull`` ("missing"): pull the parent image when it is ``missing``, ``always`` or ``never``
- ``registry`` (``[gpu] image_registry``): push derived images there (and pull them from there first)
- ``repository`` ("airflow-gpu-derived"): image name of derived images
- ``ca_bundle`` (``[gpu] ca_bundle``): PEM file that installs inside derived-image builds trust
- ``uv_source`` ("worker"): ``worker`` copies the worker's uv binary into the build; ``pip`` pip-installs uv
- ``compile_bytecode`` (True): compile ``.pyc`` files into derived images, so tasks do not compile what they import
  in every fresh container (costs build time once)
- ``devices`` (none): GPU indices or UUIDs (MIG UUIDs too) to request instead of a count
- ``driver_capabilities`` ("compute,utility"): ``NVIDIA_DRIVER_CAPABILITIES`` for GPU containers
- ``group_add`` (AMD: ``["video", "render"]``): supplementary groups for device access (names or GIDs)
- ``mount_tmp_dir`` (True): share the task's files through a bind-mounted worker folder; ``False`` copies them
  through the Docker API (remote engines; tried automatically when the engine cannot see the folder)
- ``stop_timeout`` (10): seconds between SIGTERM and SIGKILL when the task is stopped
- ``state_dir`` (``[gpu] state_dir``): host folder for the build locks
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Mapping
from typing import Any

from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.images.engine import PULL_POLICIES

OWNER = "docker backend"
AUTO_REMOVE: tuple[str, ...] = ("force", "success", "never")
MOUNT_TYPES: tuple[str, ...] = ("bind", "volume", "tmpfs")
DOCKER_SOCKETS: tuple[str, ...] = ("/var/run/docker.sock", "/run/docker.sock")


def _invalid(name: str, value: object, reason: str, accepted: str) -> InvalidSettingError:
    return InvalidSettingError(OWNER, name, value, reason, accepted)


def _string(name: str, value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        raise _invalid(name, value, "expected a non-empty string", "a string")


def _optional_string(name: str, value: object) -> None:
    if value is not None:
        _string(name, value)


def _positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise _invalid(name, value, "expected a positive number of seconds", "e.g. 10 or 2.5")


def _boolean(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise _invalid(name, value, "expected a boolean", "True or False")


def _choice(choices: tuple[str, ...]) -> Callable[[str, object], None]:
    def check(name: str, value: object) -> None:
        if value not in choices:
            raise _invalid(name, value, "unknown value", " or ".join(map(repr, choices)))

    return check


def _string_list(name: str, value: object) -> None:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        raise _invalid(name, value, "expected a non-empty list", "a list such as ['0', '1']")
    for item in value:
        if not isinstance(item, (str, int)) or isinstance(item, bool) or not str(item).strip():
            raise _invalid(name, item, "every item must be a non-empty string or integer", "strings or integers")


def _docker_url(name: str, value: object) -> None:
    urls = value if isinstance(value, (list, tuple)) else [value]
    for url in urls:
        _string(name, url)


def _user(name: str, value: object) -> None:
    if not isinstance(value, (str, int)) or isinstance(value, bool) or not str(value).strip():
        raise _invalid(name, value, "expected a user name or uid", "'1000', 1000 or '1000:1000'")


def exposes_docker_socket(source: str) -> bool:
    """Whether a bind source is the Docker socket or a folder that holds it."""
    path = posixpath.normpath(source)
    return any(socket == path or socket.startswith(path.rstrip("/") + "/") for socket in DOCKER_SOCKETS) or (
        path.endswith("docker.sock")
    )


def _mounts(name: str, value: object) -> None:
    accepted = "a list of {'source': ..., 'target': '/abs/path', 'type': 'bind'|'volume'|'tmpfs', 'read_only': bool}"
    if not isinstance(value, (list, tuple)):
        raise _invalid(name, value, "expected a list of mounts", accepted)
    for mount in value:
        if not isinstance(mount, Mapping) or set(mount) - {"source", "target", "type", "read_only"}:
            raise _invalid(name, mount, "not a mount description", accepted)
        target, kind = mount.get("target"), mount.get("type", "bind")
        if not isinstance(target, str) or not target.startswith("/"):
            raise _invalid(name, mount, "'target' must be an absolute path in the container", accepted)
        if kind not in MOUNT_TYPES:
            raise _invalid(name, mount, f"unknown mount type {kind!r}", accepted)
        source = mount.get("source")
        if kind != "tmpfs" and (not isinstance(source, str) or not source):
            raise _invalid(name, mount, "'source' is required for bind and volume mounts", accepted)
        if kind == "bind" and exposes_docker_socket(str(source)):
            raise _invalid(
                name,
                mount,
                "the Docker socket is never mounted into task containers (it gives root on the host)",
                "mounts of data or model folders",
            )


CHECKS: dict[str, Callable[[str, object], None]] = {
    "docker_conn_id": _optional_string,
    "docker_url": _docker_url,
    "api_version": _string,
    "timeout": _positive,
    "tls_ca_cert": _string,
    "tls_client_cert": _string,
    "tls_client_key": _string,
    "network_mode": _string,
    "mounts": _mounts,
    "ipc_mode": _string,
    "user": _user,
    "working_dir": _string,
    "auto_remove": _choice(AUTO_REMOVE),
    "pull": _choice(PULL_POLICIES),
    "registry": _string,
    "repository": _string,
    "ca_bundle": _string,
    "uv_source": _choice(("worker", "pip")),
    "devices": _string_list,
    "driver_capabilities": _string,
    "group_add": _string_list,
    "stop_timeout": _positive,
    "mount_tmp_dir": _boolean,
    "compile_bytecode": _boolean,
    "state_dir": _string,
}


def check_options(options: Mapping[str, Any]) -> None:
    """Check the value of every known option (names are checked by ``Backend.validate_options``)."""
    for name, value in options.items():
        CHECKS[name](name, value)


def docker_mounts(mounts: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Mount descriptions in the Docker API's form, which docker-py passes through."""
    return [
        {
            "Target": m["target"],
            "Source": m.get("source", ""),
            "Type": m.get("type", "bind"),
            "ReadOnly": bool(m.get("read_only", False)),
        }
        for m in mounts
    ]


def default_docker_url() -> str:
    """``$DOCKER_HOST`` or the local socket, as ``DockerOperator`` does."""
    return os.environ.get("DOCKER_HOST") or "unix://var/run/docker.sock"
