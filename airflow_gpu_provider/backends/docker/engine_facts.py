"""The engine a task runs on, as it describes itself (once per engine): Docker or Podman, rootless, its limits.

A rootless engine (Docker's ``dockerd-rootless.sh``, Podman's ``podman system service`` run by a user) maps the
container's root to the user who runs it: the kernel bounds what a container reaches. Without cgroups delegated to
that user (cgroup v1, or a cgroup v2 controller not delegated) it *records* a memory or CPU limit and enforces none:
such a limit is treated as absent (:mod:`.rootless`), never trusted.

- Docker: ``GET /info`` ``SecurityOptions`` holds ``name=rootless``; ``MemoryLimit``, ``CpuCfsQuota`` and
  ``PidsLimit`` say what its cgroups enforce (false for a rootless engine on cgroup v1: driver ``none``).
- Podman: ``GET /version`` names a ``Podman Engine`` component. Its compatible ``/info`` claims every limit, so
  ``GET /libpod/info`` decides: ``host.security.rootless``, and the controllers delegated to the user
  (``host.cgroupControllers``; none on cgroup v1).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

#: the limits the provider sets, by what the engine's cgroups must enforce for them (``shm`` is a tmpfs size: the
#: kernel enforces it, cgroups or not)
LIMITS: tuple[str, ...] = ("memory", "cpus", "pids")
_PODMAN_CONTROLLERS = {"memory": "memory", "cpu": "cpus", "pids": "pids"}
_cache: dict[str, EngineFacts] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class EngineFacts:
    """One engine, as it describes itself.

    :param product: ``Docker`` or ``Podman``
    :param rootless: the engine runs as a user, whose identity a container's root has on the host
    :param enforced: the limits of :data:`LIMITS` its cgroups enforce
    """

    product: str = "Docker"
    version: str = ""
    rootless: bool = False
    cgroup: str = ""
    enforced: frozenset[str] = frozenset(LIMITS)

    @property
    def podman(self) -> bool:
        """Whether it is Podman's Docker-compatible API."""
        return self.product == "Podman"

    @property
    def unenforced(self) -> tuple[str, ...]:
        """The limits this engine records but does not enforce."""
        return tuple(limit for limit in LIMITS if limit not in self.enforced)

    @property
    def kind(self) -> str:
        """``rootless Docker 20.10.24 (cgroup v1, driver none)``."""
        return f"{'rootless' if self.rootless else 'rootful'} {self.product} {self.version} ({self.cgroup})"

    def describe(self) -> str:
        """One line for the task log: the kind, and the limits it records but does not enforce."""
        missing = ", ".join(self.unenforced)
        return f"{self.kind}; " + (f"limits it records but does not enforce: {missing}" if missing else "limits hold")


def engine_facts(client: Any, url: str) -> EngineFacts:
    """The facts of the engine at ``url`` (asked once per engine and process)."""
    with _lock:
        if url not in _cache:
            _cache[url] = read_facts(client)
        return _cache[url]


def read_facts(client: Any) -> EngineFacts:
    """Ask the engine (``/version``, ``/info``; Podman's ``/libpod/info``)."""
    version = client.version()
    components = [str(c.get("Name", "")) for c in version.get("Components") or []]
    if any(name.startswith("Podman") for name in components):
        return _podman(client, str(version.get("Version", "")))
    info = client.info()
    flags = {"memory": info.get("MemoryLimit"), "cpus": info.get("CpuCfsQuota"), "pids": info.get("PidsLimit")}
    return EngineFacts(
        product="Docker",
        version=str(version.get("Version", "")),
        rootless="name=rootless" in (info.get("SecurityOptions") or []),
        cgroup=f"cgroup v{info.get('CgroupVersion') or '?'}, driver {info.get('CgroupDriver') or '?'}",
        enforced=frozenset(limit for limit, on in flags.items() if on),
    )


def _podman(client: Any, version: str) -> EngineFacts:
    response = client._get(f"{client.base_url}/v{version or '4.0.0'}/libpod/info")  # the libpod API: v4+
    host = client._result(response, json=True).get("host") or {}
    rootless = bool((host.get("security") or {}).get("rootless"))
    controllers = {_PODMAN_CONTROLLERS[c] for c in host.get("cgroupControllers") or () if c in _PODMAN_CONTROLLERS}
    return EngineFacts(
        product="Podman",
        version=version,
        rootless=rootless,
        cgroup=f"cgroup {host.get('cgroupVersion') or '?'}, manager {host.get('cgroupManager') or '?'}",
        enforced=frozenset(controllers) if rootless else frozenset(LIMITS),
    )
