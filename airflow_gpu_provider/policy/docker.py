"""The container a Docker task may get: checked on the options at DAG parse, and on the whole create call.

Rules D1-D6 of docs/security.md: a task gets no privilege and no capability the admin did not list; it runs as the
worker's own user unless the admin lists another, as numbers resolved on the worker (``policy/users.py``); it joins no
host namespace and no other container's; it sees the devices of its GPUs only; it mounts host folders only beneath
``[gpu_policy] allowed_mount_roots``, by paths no one but root and the worker can redirect, never the runtime's sockets
or the system's folders, never what tasks may write to (a folder beneath a read-write root, the state dir, a checkpoint
root), and named volumes only of ``[gpu_policy] allowed_volumes``; it reaches only the worker's default Docker engine or
one of ``[gpu_policy] allowed_clusters``.

Here: the options at DAG parse (:func:`check_options`), the engine a task reaches (:func:`check_engine`), and
the rules both checks share. The final check, on the create call's whole body, for the provider and for the
engine's authorization plugin alike: ``policy/engine.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from airflow_gpu_provider.policy import Policy, PolicyError
from airflow_gpu_provider.policy.paths import UnsafePathError, beneath, canonical
from airflow_gpu_provider.policy.rootless import engine_folders
from airflow_gpu_provider.policy.users import (
    DEVICE_GROUPS,
    USERS_ACCEPTED,
    UnknownNameError,
    container_groups,
    container_user,
    worker_ids,
)

# Whoever reaches these controls the host: never mounted, even read-only, nor any folder that holds one.
RUNTIME_CONTROL: tuple[str, ...] = (
    "/var/run/docker.sock", "/run/docker.sock", "/run/docker", "/run/containerd", "/var/run/containerd",
    "/var/lib/docker", "/var/lib/containerd", "/run/crio", "/run/podman", "/var/run/crio", "/var/run/podman",
)  # fmt: skip
# The host itself: never mounted, whatever the admin lists (devices, kernel interfaces, boot, credentials).
SYSTEM: tuple[str, ...] = ("/", "/proc", "/sys", "/dev", "/boot", "/root", "/etc", "/run", "/var/run")
#: What the provider itself adds for AMD and Intel GPUs (``backends/docker/container.py``).
DEVICE_PATHS: frozenset[str] = frozenset({"/dev/kfd", "/dev/dri"})
SAFE_SECURITY_OPTIONS: frozenset[str] = frozenset({"no-new-privileges:true", "no-new-privileges"})


def worker_user() -> str:
    """The user a Docker task runs as unless the admin lists another: the worker's own ``uid:gid``."""
    return "{}:{}".format(*worker_ids())


def root_problem(path: str, policy: Policy) -> str | None:
    """Why a host folder may not be an allowed mount root at all (the admin's list is checked against it too)."""
    if any(beneath(path, system) or beneath(system, path) for system in SYSTEM if system != "/") or path == "/":
        return "it is or holds a part of the host no task may see (devices, kernel, boot, credentials, /etc)"
    if any(beneath(path, control) or beneath(control, path) for control in RUNTIME_CONTROL):
        return "it is or holds a container runtime's socket or state, which controls the host"
    for folder in engine_folders(policy.docker_engines):  # the engine's socket folder, its user's home, runtime dir
        if beneath(path, folder) or beneath(folder, path):
            return f"it is, holds or lies in {folder}, whose holder controls every task of a Docker engine"
    for task_written in (policy.state_dir, *[r for r in policy.checkpoint_roots if "://" not in r]):
        if beneath(path, task_written) or beneath(task_written, path):
            return f"it overlaps {task_written}, which tasks write to (the state dir or a checkpoint root)"
    return None


def _mount_problem(source: str, *, writable: bool, policy: Policy) -> tuple[str, str] | None:
    """``(reason, option)`` when a bind mount of ``source`` is not allowed, by its name; ``None`` when it is."""
    try:
        path = canonical(source)
    except UnsafePathError as err:
        return err.problem, "allowed_mount_roots"
    problem = root_problem(path, policy)
    if problem:
        return problem, "allowed_mount_roots"
    for root in policy.mount_roots:  # the most specific root that holds the path decides
        if not beneath(path, root.path):
            continue
        if writable and not root.writable:
            return f"{root.path} may be mounted read-only only", "allowed_mount_roots"
        if path != root.path and any(beneath(path, r.path) and r.writable for r in policy.mount_roots):
            # another task may write there, and so swap a folder of this path for a link to the host's /
            return f"it lies beneath {root.path}, which tasks may mount read-write: mount the root itself", (
                "allowed_mount_roots"
            )
        return None
    return "it is beneath none of the roots the deployment allows", "allowed_mount_roots"


def engine_key(url: str) -> str:
    """An engine's URL as the allow-list compares it: ``unix://var/run/x`` is ``unix:///var/run/x``; hosts lower."""
    scheme, colon, rest = url.strip().partition("://")
    if not colon:
        return url.strip()
    if scheme.lower() == "unix":
        return "unix:///" + rest.lstrip("/")
    return f"{scheme.lower()}://{rest.rstrip('/').lower()}"


def check_engine(owner: str, engines: Sequence[str], default: str, policy: Policy) -> None:
    """The engine a task reaches: this process's default one, or one of ``[gpu_policy] allowed_clusters``.

    The default is ``$DOCKER_HOST`` or the local socket. Checked at parse, on the worker and in the triggerer.

    :raises PolicyError: naming the engine and the option
    """
    allowed = {engine_key(engine) for engine in (default, *policy.docker_engines)}
    for engine in engines:
        if engine_key(engine) not in allowed:
            listed = ", ".join((f"{default} (the default)", *(f"docker={url}" for url in policy.docker_engines)))
            raise PolicyError(owner, "backend_options['docker_url']", engine, "an engine the deployment does not list",
                              option="allowed_clusters", allow=listed)  # fmt: skip


def check_options(owner: str, options: Any, policy: Policy) -> None:
    """At DAG parse: what a Docker task's options ask for of the host, against ``policy``.

    :raises PolicyError: naming the option, the value and the ``[gpu]`` allow-list that would allow it
    """
    for mount in options.mounts:
        kind = mount.get("type", "bind")
        if kind == "bind":  # rule D5
            found = _mount_problem(mount["source"], writable=not mount.get("read_only"), policy=policy)
            if found:
                raise PolicyError(owner, "backend_options['mounts']", mount, found[0], option=found[1],
                                  allow=_roots(policy))  # fmt: skip
        elif kind == "volume" and mount["source"] not in policy.volumes:
            raise PolicyError(owner, "backend_options['mounts']", mount, "a named volume the deployment does not list",
                              option="allowed_volumes", allow=_listed(policy.volumes))  # fmt: skip
    _check_listed(owner, "cap_add", options.cap_add, policy.capabilities, "allowed_capabilities", upper=True)
    check_engine(owner, options.engines, options.default_engine, policy)
    task_user(owner, options.user, policy)
    task_groups(owner, options.group_add or (), policy)
    for field, value, allowed, option in (  # rule D3
        ("network_mode", options.network_mode, policy.network_modes, "allowed_network_modes"),
        ("ipc_mode", options.ipc_mode, policy.ipc_modes, "allowed_ipc_modes"),
    ):
        if value is not None and value not in allowed:
            raise PolicyError(owner, f"backend_options[{field!r}]", value, "a mode the deployment does not list",
                              option=option, allow=_listed(allowed))  # fmt: skip


def task_user(owner: str, user: str | int | None, policy: Policy) -> str:
    """The ``uid:gid`` a task's container runs as, resolved on this host (rule D2, ``policy/users.py``).

    The worker's own unless the admin lists another (root only if listed). A worker that runs as root makes root its
    own user: run workers as a user of their own (docs/security.md).

    :raises PolicyError: for a user (or a group of it) the deployment does not list, or a name this host lacks
    """
    try:
        return container_user(user, policy.users)
    except (UnknownNameError, PermissionError) as err:
        raise PolicyError(owner, "backend_options['user']", user, str(err), option="allowed_users",
                          allow=f"the worker's own ({worker_user()}), {_listed(policy.users)}; each "
                          f"{USERS_ACCEPTED}") from None  # fmt: skip


def task_groups(owner: str, groups: Sequence[str | int], policy: Policy) -> list[str]:
    """A task's supplementary groups as this host's gids (rule D4): listed ones and the device groups only.

    :raises PolicyError: for a group the deployment does not list, or a name this host lacks
    """
    try:
        return container_groups(groups, policy.groups)
    except (UnknownNameError, PermissionError) as err:
        raise PolicyError(owner, "backend_options['group_add']", list(groups), str(err), option="allowed_groups",
                          allow=_listed(policy.groups | set(DEVICE_GROUPS))) from None  # fmt: skip


def _check_listed(
    owner: str, field: str, values: Iterable[Any], allowed: frozenset[str], option: str, *, upper: bool = False
) -> None:
    for value in values:
        name = str(value).upper().removeprefix("CAP_") if upper else str(value)
        if name == "ALL" or name not in allowed:  # rules D1, D4: ALL is never a default
            raise PolicyError(owner, f"backend_options[{field!r}]", value, "not in the deployment's list",
                              option=option, allow=_listed(allowed))  # fmt: skip


def _listed(values: Iterable[str]) -> str:
    return ", ".join(sorted(values)) or "none (the list is empty)"


def _roots(policy: Policy) -> str:
    return ", ".join(f"{r.path}:{'rw' if r.writable else 'ro'}" for r in policy.mount_roots) or "none"
