"""The one policy layer: every decision that reaches the host, for every backend, against the admin's allow-lists.

Default deny. A DAG author's task gets of a host what the deployment's ``[gpu_policy]`` allow-lists give
(``config/policy.py``), nothing more; asking for more is an error at DAG parse naming the field, the value and the
``[gpu_policy]`` option that would allow it (:class:`PolicyError`). The worker checks again on the final object it
submits, with its own configuration. Standard library only: the authorization plugin imports it. Nothing else in the
package makes these decisions; each check names the rule of docs/security.md it enforces.

- ``paths.py``: no path trusted by its name (resolved without links, every ancestor checked, deletions by marker)
- ``docker.py``: the container a Docker task may get (mounts, capabilities, users, groups, namespaces, devices),
  and the engine it may reach
- ``users.py``: who a container runs as and which groups it joins, as numbers resolved on this host
- ``engine.py``: a container create call's whole body, as the engine reads it (the provider's final check, and the
  engine's authorization plugin's)
- ``authz/``: the Docker engine's authorization plugin: rules D1-D5 for every client of the engine
- ``pods.py``: the pod a Kubernetes task may get (Pod Security Standards over the whole pod, the cluster objects it
  may name, device isolation in every container)
- ``build.py``: what of the worker a derived image's build may read
- ``checkpoints.py``: the roots a task may checkpoint to, and what may be deleted
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_gpu_provider.config.policy import CLUSTER_KINDS, OBJECT_KINDS, SECTION, SLURM_OBJECT_KINDS
from airflow_gpu_provider.exceptions import InvalidSettingError

if TYPE_CHECKING:
    from airflow_gpu_provider.config.worker import GpuConfig

LEVELS = ("restricted", "baseline", "privileged")  # Pod Security Standards, strongest first
DEPLOYMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")  # a deployment's name, as a label value shows it
_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # a DNS subdomain, as the API server names
_SLURM_NAME = re.compile(r"^[A-Za-z0-9_][-A-Za-z0-9_.]{0,63}$")  # a partition's, account's, QoS's or reservation's
#: the form of each kind's names (a pod's objects: DNS subdomains)
_FORMS = {kind: _SLURM_NAME if kind in SLURM_OBJECT_KINDS else _OBJECT_NAME for kind in OBJECT_KINDS}


class PolicyError(InvalidSettingError):
    """A task asks for more of a host than the deployment's ``[gpu_policy]`` allow-lists give."""

    def __init__(self, owner: str, field: str, value: object, reason: str, *, option: str, allow: str) -> None:
        super().__init__(owner, field, value, f"{reason} ({option})", f"what [{SECTION}] {option} lists: {allow}")
        self.option = option


def _names(text: str) -> frozenset[str]:
    return frozenset(part.strip() for part in text.split(",") if part.strip())


def _paths(option: str, text: str) -> tuple[str, ...]:
    from airflow_gpu_provider.policy.paths import UnsafePathError, canonical, root_parts

    roots = []
    for part in filter(None, (item.strip() for item in text.split(","))):
        try:
            if "://" in part:
                root_parts(part)  # a URI is compared by its components: they must be plain ones
            roots.append(part.removesuffix("/") if "://" in part else canonical(part))
        except UnsafePathError as err:
            why = f"{part!r} is no absolute path or plain URI ({err.problem})"
            raise ValueError(f"[{SECTION}] {option}: {why}") from None
    return tuple(roots)


def _objects(text: str) -> dict[str, frozenset[str]]:
    """``allowed_objects``: ``KIND=NAME, ...`` by kind."""
    listed: dict[str, set[str]] = {kind: set() for kind in OBJECT_KINDS}
    for part in filter(None, (item.strip() for item in text.split(","))):
        kind, _, name = (piece.strip() for piece in part.partition("="))
        if kind not in listed or not name or (name != "*" and not _FORMS[kind].fullmatch(name)):
            raise ValueError(
                f"[{SECTION}] allowed_objects: {part!r} is not KIND=NAME with KIND one of "
                f"{', '.join(OBJECT_KINDS)} and NAME an object's name (or *)"
            )
        listed[kind].add(name)
    return {kind: frozenset(names) for kind, names in listed.items()}


def _clusters(text: str) -> dict[str, tuple[str, ...]]:
    """``allowed_clusters``: ``KIND=ADDRESS, ...`` by kind, each kind's addresses sorted."""
    listed: dict[str, set[str]] = {kind: set() for kind in CLUSTER_KINDS}
    for part in filter(None, (item.strip() for item in text.split(","))):
        kind, _, address = (piece.strip() for piece in part.partition("="))
        if kind not in listed or not address:
            raise ValueError(
                f"[{SECTION}] allowed_clusters: {part!r} is not KIND=ADDRESS, KIND one of {', '.join(CLUSTER_KINDS)}"
            )
        listed[kind].add(address)
    return {kind: tuple(sorted(addresses)) for kind, addresses in listed.items()}


class MountRoot(NamedTuple):
    """A host folder Docker tasks may mount, and whether read-write."""

    path: str
    writable: bool


def _mount_roots(text: str) -> tuple[MountRoot, ...]:
    roots: list[MountRoot] = []
    for part in filter(None, (item.strip() for item in text.split(","))):
        path, _, mode = part.rpartition(":") if part.endswith((":ro", ":rw")) else (part, "", "ro")
        (clean,) = _paths("allowed_mount_roots", path)
        if clean == "/":
            raise ValueError(f"[{SECTION}] allowed_mount_roots: '/' would give tasks the whole host")
        if any(root.path == clean and root.writable != (mode == "rw") for root in roots):
            raise ValueError(f"[{SECTION}] allowed_mount_roots: {clean} is listed both read-only and read-write")
        roots.append(MountRoot(clean, mode == "rw"))
    return tuple(sorted(set(roots), key=lambda root: -len(root.path)))  # the most specific root first


class Policy(NamedTuple):
    """The admin's allow-lists, parsed: what a DAG author's task may get of a host."""

    mount_roots: tuple[MountRoot, ...]
    volumes: frozenset[str]
    capabilities: frozenset[str]
    users: frozenset[str]
    groups: frozenset[str]
    clusters: dict[str, tuple[str, ...]]
    network_modes: frozenset[str]
    ipc_modes: frozenset[str]
    build_paths: tuple[str, ...]
    checkpoint_roots: tuple[str, ...]
    min_pod_security: str
    state_dir: str
    objects: dict[str, frozenset[str]]
    deployment: str

    @property
    def docker_engines(self) -> tuple[str, ...]:
        """The Docker engines of ``allowed_clusters``."""
        return self.clusters["docker"]

    @classmethod
    def of(cls, conf: GpuConfig | Any) -> Policy:
        """The policy of a configuration (``GpuConfig``, or anything with its attributes).

        :raises ValueError: naming the option whose value is malformed
        """
        if conf.min_pod_security not in LEVELS:
            raise ValueError(f"[{SECTION}] min_pod_security={conf.min_pod_security!r} is none of {', '.join(LEVELS)}")
        if conf.deployment and not DEPLOYMENT.fullmatch(conf.deployment):
            raise ValueError(f"[{SECTION}] deployment={conf.deployment!r} is not a name of letters, digits, . _ -")
        default_root = conf.checkpoint_root or f"{conf.state_dir.rstrip('/')}/checkpoints"
        return cls(
            mount_roots=_mount_roots(conf.allowed_mount_roots),
            volumes=_names(conf.allowed_volumes),
            capabilities=frozenset(name.upper().removeprefix("CAP_") for name in _names(conf.allowed_capabilities)),
            users=_names(conf.allowed_users),
            groups=_names(conf.allowed_groups),
            clusters=_clusters(conf.allowed_clusters),
            network_modes=_names(conf.allowed_network_modes),
            ipc_modes=_names(conf.allowed_ipc_modes),
            build_paths=_paths("allowed_build_paths", conf.allowed_build_paths),
            checkpoint_roots=(
                *_paths("checkpoint_root", default_root),
                *_paths("allowed_checkpoint_roots", conf.allowed_checkpoint_roots),
            ),
            min_pod_security=conf.min_pod_security,
            state_dir=conf.state_dir,
            objects=_objects(conf.allowed_objects),
            deployment=conf.deployment,
        )

    @classmethod
    def current(cls) -> Policy:
        """The policy of this process's configuration (at DAG parse, the DAG processor's)."""
        from airflow_gpu_provider.config.worker import GpuConfig

        return cls.of(GpuConfig.read())

    def allows_pod_security(self, level: str) -> bool:
        """Whether a task may ask for pod-security ``level``."""
        return LEVELS.index(level) <= LEVELS.index(self.min_pod_security)
