"""A task's container as a rootless engine, or Podman, can give it (:mod:`.engine_facts` says which engine it is).

- **Limits the engine records but does not enforce** (:attr:`.EngineFacts.unenforced`: no cgroup controller
  delegated to the engine's user) are left out of the create call and said in the task log: the container has no
  such limit, and nothing pretends it has. ``/dev/shm`` is a tmpfs of the requested size whatever the cgroups.
- **The NVIDIA ulimits**: a rootless engine cannot raise a hard limit above its user's, so ``memlock -1`` fails
  every start (Docker) or is cut silently (Podman): the container keeps the engine user's own ``memlock``.
- **The user**: the container's root *is* the engine's user on the host, and any other uid a subordinate one that
  owns nothing of the host. The worker's own user (the default) runs as ``0:0``, so that the task's files and its
  read-write checkpoint folder, the worker's own, are the container user's too.
- **GPUs on Podman**: its compatible API ignores ``device_requests`` (the container starts without a GPU). A
  rootless Podman is asked by CDI names instead (``HostConfig.Devices`` ``nvidia.com/gpu=<id>``), and
  :func:`gpu_problem` checks the created container recorded what was asked: a request dropped is a refusal,
  never a GPU task run without its GPUs.
"""

from __future__ import annotations

from typing import Any

from airflow_gpu_provider.backends.docker.engine_facts import EngineFacts
from airflow_gpu_provider.policy.docker import worker_user
from airflow_gpu_provider.settings import NVIDIA, ResourceSettings
from airflow_gpu_provider.settings.units import format_bytes

CDI_KIND = "nvidia.com/gpu"
PODMAN_FIX = (
    "On Podman, GPUs are given by CDI: generate the spec (nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml), "
    "use a rootless Podman whose Docker-compatible API takes CDI devices (5.x), and list the host's GPUs "
    "([gpu] devices) so that each task's are named; or run GPU tasks on Docker with the NVIDIA Container Toolkit"
)
_CONTROLLERS = {"memory": "memory", "cpus": "cpu", "pids": "pids"}
_LIMIT_KEYS = {"memory": ("mem_limit", "memswap_limit"), "cpus": ("nano_cpus",), "pids": ("pids_limit",)}


def engine_notes(resources: ResourceSettings, facts: EngineFacts) -> tuple[str, ...]:
    """What the task log must say of a task's resources on this engine (nothing on a rootful Docker)."""
    notes = []
    asked = {"memory": resources.memory, "cpus": resources.cpu_count}
    for limit in facts.unenforced:
        if asked.get(limit) is None:
            continue
        value = format_bytes(asked[limit]) if limit == "memory" else asked[limit]
        notes.append(
            f"{limit}={value} is not enforced on this {facts.kind}: its user has no {_CONTROLLERS[limit]} "
            "cgroup controller, so the container gets no such limit (treated as absent). Delegate the controller "
            "to the engine's user (cgroup v2) to enforce it."
        )
    if facts.rootless and resources.requests_gpus and resources.gpu_vendor == NVIDIA:
        notes.append(
            "memlock ulimit: a rootless engine cannot raise it above its user's hard limit, so the container keeps "
            "the engine user's (raise it for that user in /etc/security/limits.conf)."
        )
    return tuple(notes)


def on_engine(kwargs: dict[str, Any], facts: EngineFacts | None) -> dict[str, Any]:
    """``create_container`` arguments (with ``host_config``) as this engine honours them (``None``: as given)."""
    if facts is None:
        return kwargs
    host = dict(kwargs["host_config"])
    for limit in facts.unenforced:
        for key in _LIMIT_KEYS[limit]:
            host.pop(key, None)
    if facts.rootless:
        host["ulimits"] = [u for u in host.get("ulimits") or () if u.get("name") != "memlock"] or None
        if kwargs.get("user") == worker_user():
            kwargs = {**kwargs, "user": "0:0"}  # the container's root is the worker's user on the host
    if facts.podman and facts.rootless and host.get("device_requests"):
        names = cdi_names(host["device_requests"])
        if names:
            host.pop("device_requests")
            cdi = [f"{name}:{name}:rwm" for name in names]
            host["devices"] = [*(host.get("devices") or ()), *cdi]
    return {**kwargs, "host_config": {key: value for key, value in host.items() if value is not None}}


def cdi_names(requests: list[dict[str, Any]]) -> list[str]:
    """The CDI names of NVIDIA device requests: one per GPU id, or ``all``; none for a bare count (unnamed GPUs)."""
    names = []
    for request in requests:
        ids = request.get("device_ids") or ([] if request.get("count") != -1 else ["all"])
        if not ids:
            return []
        names += [f"{CDI_KIND}={device}" for device in ids]
    return names


def cdi_requested(devices: list[Any] | None) -> list[str]:
    """The CDI names among ``HostConfig.Devices`` (docker-py's ``host:container:mode`` or the API's objects)."""
    found = []
    for device in devices or ():
        path = device.get("PathOnHost", "") if isinstance(device, dict) else str(device).split(":")[0]
        if path.startswith(f"{CDI_KIND}="):
            found.append(path)
    return found


def gpu_problem(created: dict[str, Any], kwargs: dict[str, Any]) -> str | None:
    """Why the created container (its ``inspect``) lacks the GPUs the create call asked for; ``None`` if it has them.

    An engine that ignores a request (Podman's compatible API and ``device_requests``) stores none of it.
    """
    asked = kwargs["host_config"]
    host = created.get("HostConfig") or {}
    if asked.get("device_requests") and not host.get("DeviceRequests"):
        return "the engine dropped the GPU request (device_requests): the container would run without its GPUs"
    missing = sorted(set(cdi_requested(asked.get("devices"))) - set(cdi_requested(host.get("Devices"))))
    if missing:
        return f"the engine did not record the CDI devices {missing}: the container would run without its GPUs"
    return None


def dropped_limits(created: dict[str, Any], kwargs: dict[str, Any]) -> list[str]:
    """Limits the create call set that the created container does not record (an engine that drops them)."""
    asked, host = kwargs["host_config"], created.get("HostConfig") or {}
    pairs = (("memory", "mem_limit", "Memory"), ("cpus", "nano_cpus", "NanoCpus"))
    return [limit for limit, key, field in pairs if asked.get(key) and not host.get(field)]
