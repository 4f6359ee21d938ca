"""What the engine has stored, judged as its create would have been: a container, a volume, an image.

A call on a container (start, attach, wait, logs, archive, stop, delete, commit) is judged by the container the
engine has (``GET /containers/{id}/json``, asked by the plugin, never the client's word): it must carry this
deployment's label, and its stored configuration, read back as the create call that would make it
(:func:`as_created`), must pass the very check a create passes (``policy/engine.py``). So a container made before the
plugin was installed, or by a client the plugin never saw, is reached only if it could have been made now.

The engine stores what it filled in itself: its logging driver and runtime, the cgroup and IPC namespace modes it
defaults to, the paths it masks in ``/proc``, the network of the default mode, the image's configuration. Each
of those is read back as "not asked for" only when it is the engine's own default (``/info`` tells the driver,
the runtime and the cgroup version); any other stored value is judged as asked.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_gpu_provider.policy import Policy
from airflow_gpu_provider.policy.engine import check_create
from airflow_gpu_provider.policy.paths import UnsafePathError
from airflow_gpu_provider.task.labels import docker_label

DEPLOYMENT_LABEL = docker_label("deployment")
#: the paths the engine masks and makes read-only in ``/proc`` and ``/sys`` when a create names none (20.10 to 28)
MASKED = [
    "/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
    "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware",
]  # fmt: skip
MASKED_NEWER = [*MASKED[:9], "/sys/devices/virtual/powercap", *MASKED[9:]]  # engines from 25 mask powercap too
READ_ONLY = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
#: Config fields of an image that a container's stored configuration carries, no create's
IMAGE_ONLY = ("OnBuild", "ArgsEscaped")


def labelled(found: Mapping[str, Any], policy: Policy, what: str) -> None:
    """Refuse an object (its inspect) that does not carry this deployment's label.

    :raises UnsafePathError: naming the object and the label it lacks
    """
    labels = (found.get("Config") or {}).get("Labels") or found.get("Labels") or {}
    if labels.get(DEPLOYMENT_LABEL) != policy.deployment:
        raise UnsafePathError(what, f"not this deployment's (label {DEPLOYMENT_LABEL}={policy.deployment!r})")


def as_created(found: Mapping[str, Any], info: Mapping[str, Any]) -> dict[str, Any]:
    """The create call's body that would make the container ``found`` (its inspect) on the engine ``info`` describes."""
    config = {k: v for k, v in (found.get("Config") or {}).items() if k not in IMAGE_ONLY}
    host = dict(found.get("HostConfig") or {})
    defaults: dict[str, Any] = {
        "LogConfig": {"Type": info.get("LoggingDriver"), "Config": {}},
        "Runtime": info.get("DefaultRuntime"),
    }
    for name, default in defaults.items():
        if host.get(name) == default:
            host[name] = None
    own_cgroupns = "host" if str(info.get("CgroupVersion")) == "1" else "private"
    if host.get("CgroupnsMode") in ("private", own_cgroupns):  # the engine's default mode, or its own namespace
        host["CgroupnsMode"] = None
    if host.get("IpcMode") in ("private", "shareable"):  # the engine's default modes: the container's own namespace
        host["IpcMode"] = None
    if host.get("MaskedPaths") in (MASKED, MASKED_NEWER):
        host["MaskedPaths"] = None
    if host.get("ReadonlyPaths") == READ_ONLY:
        host["ReadonlyPaths"] = None
    networks = dict((found.get("NetworkSettings") or {}).get("Networks") or {})
    if host.get("NetworkMode") in ("default", "bridge") and set(networks) <= {"bridge"}:
        networks = {}  # the default mode's network
    endpoints = {name: {"Links": e.get("Links"), "DriverOpts": e.get("DriverOpts")} for name, e in networks.items()}
    return {**config, "HostConfig": host, "NetworkingConfig": {"EndpointsConfig": endpoints} if endpoints else None}


def check_container(found: Mapping[str, Any], policy: Policy, info: Mapping[str, Any]) -> None:
    """A call's target container: this deployment's, and what a create could make now.

    :raises UnsafePathError: naming the container and what is wrong with it
    """
    what = f"container {str(found.get('Id', ''))[:12]}"
    labelled(found, policy, what)
    try:
        check_create(as_created(found, info), policy)
    except UnsafePathError as err:
        raise UnsafePathError(what, f"its stored configuration is no create the policy allows: {err}") from None


def writable_mounts(found: Mapping[str, Any]) -> list[str]:
    """Where the container ``found`` (its inspect) may write into a host folder or a volume."""
    return [str(m.get("Destination")) for m in found.get("Mounts") or [] if m.get("Type") != "tmpfs" and m.get("RW")]
