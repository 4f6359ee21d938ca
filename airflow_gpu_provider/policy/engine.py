"""The container a create call asks for, judged on the body the engine gets: rules D1-D5, for every client.

ONE function, :func:`check_create`, judges a ``POST /containers/create`` body: the Docker backend's own final call
(``backends/docker/lifecycle.py``) and, in the engine's authorization plugin (``policy/authz/``), any client's.
The body is read as Go's ``encoding/json`` reads it: a name matches its field whatever its case (``ſ``, ``K`` fold
to ``s``, ``k``), so two names that fold together are refused; HostConfig fields at the top level are read too, so
nothing is accepted there that is not a Config field. Default deny: a field not judged or known to be harmless must
be empty (``MaskedPaths`` and ``ReadonlyPaths`` ``null``: an empty list unmasks ``/proc``). Users and groups are
numbers of the judging host (``policy/users.py``): a name would be resolved in the image's own databases.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from airflow_gpu_provider.policy import Policy
from airflow_gpu_provider.policy.docker import DEVICE_PATHS, SAFE_SECURITY_OPTIONS, _mount_problem
from airflow_gpu_provider.policy.paths import UnsafePathError, beneath, canonical, stable
from airflow_gpu_provider.policy.rootless import split_cdi
from airflow_gpu_provider.policy.users import allowed_gids, number, numeric_user, user_allowed
from airflow_gpu_provider.task.labels import docker_label

TASKS_FOLDER = "docker-tasks"  # the state dir's folder of the task files the provider mounts read-only
DEPLOYMENT_LABEL = docker_label("deployment")  # the deployment whose workers made a container (host/workers.py)
#: Container Config fields that reach nothing of the host (the user is judged, rule D2).
CONFIG = frozenset((
    "hostname", "domainname", "attachstdin", "attachstdout", "attachstderr", "exposedports", "tty", "openstdin",
    "stdinonce", "env", "cmd", "healthcheck", "argsescaped", "image", "volumes", "workingdir", "entrypoint",
    "networkdisabled", "macaddress", "onbuild", "labels", "stopsignal", "stoptimeout", "shell",
))  # fmt: skip
#: HostConfig fields that reach nothing of the host beyond the container's own limits.
HARMLESS = frozenset((
    "containeridfile", "restartpolicy", "autoremove", "consolesize", "dns", "dnsoptions", "dnssearch", "extrahosts",
    "readonlyrootfs", "shmsize", "init", "tmpfs", "cpushares", "memory", "nanocpus", "blkioweight",
    "blkioweightdevice", "blkiodevicereadbps", "blkiodevicewritebps", "blkiodevicereadiops", "blkiodevicewriteiops",
    "cpuperiod", "cpuquota", "cpusetcpus", "cpusetmems", "kernelmemory", "kernelmemorytcp", "memoryreservation",
    "memoryswap", "memoryswappiness", "pidslimit", "cpucount", "cpupercent", "iomaximumiops",
    "iomaximumbandwidth",
))  # fmt: skip
#: Never given a value (rule D3 and the rest of the host): a namespace, cgroup or runtime of the host's.
NEVER = frozenset((
    "pidmode", "usernsmode", "utsmode", "cgroupnsmode", "cgroup", "volumesfrom", "links", "sysctls", "binds",
    "volumedriver", "runtime", "cgroupparent", "devicecgrouprules", "oomscoreadj", "portbindings", "publishallports",
    "storageopt", "isolation", "cpurealtimeperiod", "cpurealtimeruntime",
))  # fmt: skip
NULL_ONLY = frozenset({"maskedpaths", "readonlypaths"})
#: The only ulimits a container may get, and only with a GPU request: NVIDIA's for PyTorch (unlimited locked memory,
#: a 64 MiB stack). Another (rtprio, nice: the host's CPU; memlock without a GPU) is never given.
GPU_ULIMITS = {"memlock": (-1, -1), "stack": (67108864, 67108864)}


def _refuse(field: str, value: object, why: str) -> UnsafePathError:
    return UnsafePathError(f"the container's {field}={value!r}", why)


def fields(where: str, value: object) -> dict[str, Any]:
    """A JSON object's members by their folded name (as Go matches them); two names that fold together are refused."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _refuse(where, value, "not a JSON object")
    found: dict[str, Any] = {}
    for name, member in value.items():
        key = str(name).casefold()
        if key in found:
            raise _refuse(where, name, "a field named twice (the engine would merge the two)")
        found[key] = member
    return found


def empty(value: object) -> bool:
    """Whether a value is JSON's zero value (``null``, ``false``, ``0``, ``""``, ``[]``, ``{}``): "not set"."""
    return value is None or value is False or value in (0, "", [], {})


def _none_but(where: str, members: Mapping[str, Any], known: frozenset[str]) -> None:
    """Default deny: every member not in ``known`` is empty."""
    for name, value in members.items():
        if name not in known and not empty(value):
            why = "rules D1-D5: the host's namespaces, cgroups, devices, ports and runtimes are never given"
            raise _refuse(f"{where}{name}", value, why if name in NEVER else "a field no policy allows (default deny)")


def _null_only(where: str, members: Mapping[str, Any]) -> None:
    for name in NULL_ONLY & members.keys():
        if members[name] is not None:  # an empty list unmasks /proc's files
            raise _refuse(f"{where}{name}", members[name], "only the engine's defaults (null) are allowed")


def check_create(body: Mapping[str, Any], policy: Policy, *, rootless: bool = False) -> None:
    """Rules D1-D5 on a whole ``POST /containers/create`` body, as the engine will read it.

    :param rootless: the body goes to a rootless engine: its ``0:0`` is the worker, and it takes GPUs by CDI name
        (``policy/rootless.py``)
    :raises UnsafePathError: naming the field, its value and the rule or ``[gpu]`` option it breaks
    """
    top = fields("body", body)
    _none_but("", top, CONFIG | {"user", "hostconfig", "networkingconfig"})
    _null_only("", top)
    labels = top.get("labels") or {}
    if policy.deployment and (not isinstance(labels, Mapping) or labels.get(DEPLOYMENT_LABEL) != policy.deployment):
        why = f"the deployment's label {DEPLOYMENT_LABEL}={policy.deployment!r} ([gpu_policy] deployment)"
        raise _refuse("Labels", labels, f"{why}: the workers and the engine's authorization plugin must agree")
    host = fields("HostConfig", top.get("hostconfig"))
    gpus: list[str] = []
    if rootless and "devices" in host:
        host["devices"], gpus = split_cdi(host["devices"])
    check_host_config(host, policy, cdi_gpus=bool(gpus))
    user = str(top.get("user") or "")
    own = _user_allowed(user, policy) or (rootless and user == "0:0")
    if (gpus or reaches_host(host)) and not own:  # rule D2
        raise _refuse("User", user or "the image's own", USER_RULE)
    if list(host.get("capdrop") or []) != ["ALL"]:  # rule D1
        raise _refuse("HostConfig.CapDrop", host.get("capdrop"), "rule D1: every capability is dropped (['ALL'])")
    if not set(host.get("securityopt") or []) & SAFE_SECURITY_OPTIONS:
        raise _refuse("HostConfig.SecurityOpt", host.get("securityopt"), "rule D1: no-new-privileges is required")
    network = fields("NetworkingConfig", top.get("networkingconfig"))
    _none_but("NetworkingConfig.", network, frozenset({"endpointsconfig"}))
    endpoints = network.get("endpointsconfig") or {}
    if not isinstance(endpoints, Mapping):
        raise _refuse("NetworkingConfig.EndpointsConfig", endpoints, "not a JSON object")
    for name, endpoint in endpoints.items():  # network names are matched as written
        if name != "default" and name not in policy.network_modes:  # rule D3
            why = "rule D3: [gpu_policy] allowed_network_modes lacks it"
            raise _refuse("NetworkingConfig.EndpointsConfig", name, why)
        settings = fields(f"NetworkingConfig.EndpointsConfig.{name}", endpoint)
        for key in ("links", "driveropts"):  # rule D3: no other container's namespace, no driver options
            if not empty(settings.get(key)):
                raise _refuse(f"NetworkingConfig.EndpointsConfig.{name}.{key}", settings[key], "rule D3: never set")


USER_RULE = "rule D2: the worker's own uid:gid, or one of [gpu_policy] allowed_users, in numbers (never a name)"


def _user_allowed(user: str, policy: Policy) -> bool:
    """Rule D2: ``uid:gid`` in numbers, the worker's own or a pair of ``allowed_users`` as this host resolves it.

    A name, or a uid without its gid, would be resolved by the engine in the container's own ``/etc/passwd`` (the
    image's), where ``alice`` may be uid 0 and a uid's group any gid (``policy/users.py``).
    """
    ids = numeric_user(user)
    return ids is not None and user_allowed(ids, policy.users)


def reaches_host(host: Mapping[str, Any]) -> bool:
    """Whether a container gets anything of the host: a host folder, a named volume, a device or a GPU.

    Rule D2 binds the user of such a container only: without them (a derived image's install container, or a
    build step) the container's user reaches nothing of the host that its permissions would guard.
    """
    mounts = [fields("HostConfig.Mounts", mount) for mount in host.get("mounts") or []]
    kinds = {str(mount.get("type") or "bind") for mount in mounts}
    return bool(kinds - {"tmpfs"} or host.get("devices") or host.get("devicerequests") or host.get("binds"))


def check_host_config(host: Mapping[str, Any], policy: Policy, *, cdi_gpus: bool = False) -> None:
    """Every field of a HostConfig (folded names), or of an update's; ``cdi_gpus``: rootless GPUs split off."""
    for name, value in host.items():
        if name in JUDGED:
            JUDGED[name](value, policy)
    _ulimits(host, cdi_gpus)
    _null_only("HostConfig.", host)
    _none_but("HostConfig.", host, HARMLESS | JUDGED.keys() | NULL_ONLY | {"capdrop", "ulimits"})


def _ulimits(host: Mapping[str, Any], cdi_gpus: bool) -> None:
    for limit in host.get("ulimits") or []:
        members = fields("HostConfig.Ulimits", limit)
        _none_but("HostConfig.Ulimits.", members, frozenset({"name", "soft", "hard"}))
        pair = GPU_ULIMITS.get(str(members.get("name")))
        gpu = cdi_gpus or host.get("devicerequests")
        if pair is None or pair != (members.get("soft"), members.get("hard")) or not gpu:
            why = "only NVIDIA's memlock=-1 and stack=64 MiB, with a GPU request (rtprio, nice reach the host's CPU)"
            raise _refuse("HostConfig.Ulimits", limit, why)


def _no_privilege(value: Any, policy: Policy) -> None:
    if value:  # rule D1
        raise _refuse("HostConfig.Privileged/OomKillDisable", value, "rule D1: nothing privileged")


def _capabilities(value: Any, policy: Policy) -> None:
    for capability in value or []:  # rule D1: ALL never, the rest only as listed
        name = str(capability).upper().removeprefix("CAP_")
        if name == "ALL" or name not in policy.capabilities:
            raise _refuse("HostConfig.CapAdd", capability, "rule D1: [gpu_policy] allowed_capabilities lacks it")


def _security_options(value: Any, policy: Policy) -> None:
    options = set(value or [])
    if options - SAFE_SECURITY_OPTIONS:  # rule D1: the engine's default seccomp and AppArmor profiles
        raise _refuse("HostConfig.SecurityOpt", sorted(options), "rule D1: only no-new-privileges")


def _network_mode(value: Any, policy: Policy) -> None:
    if value not in (None, "", "default") and value not in policy.network_modes:  # rule D3
        raise _refuse("HostConfig.NetworkMode", value, "rule D3: [gpu_policy] allowed_network_modes lacks it")


def _ipc_mode(value: Any, policy: Policy) -> None:
    if value not in (None, "", "default") and value not in policy.ipc_modes:  # rule D3
        raise _refuse("HostConfig.IpcMode", value, "rule D3: [gpu_policy] allowed_ipc_modes lacks it")


def _devices(value: Any, policy: Policy) -> None:
    for device in value or []:  # rule D4: /dev/kfd and /dev/dri, as the provider adds them for AMD and Intel
        path = fields("HostConfig.Devices", device).get("pathonhost")
        if path not in DEVICE_PATHS:
            raise _refuse("HostConfig.Devices", device, "rule D4: only /dev/kfd and /dev/dri")


def _device_requests(value: Any, policy: Policy) -> None:
    for request in value or []:  # rule D4: GPUs, by count or id, from the GPU runtime
        members = fields("HostConfig.DeviceRequests", request)
        if members.get("capabilities") != [["gpu"]]:
            raise _refuse("HostConfig.DeviceRequests", request, "rule D4: a GPU request only ([['gpu']])")
        if members.get("driver") not in (None, "", "nvidia"):
            raise _refuse("HostConfig.DeviceRequests", request, "rule D4: the GPU runtime's driver only")
        _none_but("HostConfig.DeviceRequests.", members, frozenset({"capabilities", "driver", "count", "deviceids"}))


def _log_config(value: Any, policy: Policy) -> None:
    if not all(empty(member) for member in fields("HostConfig.LogConfig", value).values()):
        raise _refuse("HostConfig.LogConfig", value, "the engine's own log driver only (a driver reaches the host)")


def _groups(value: Any, policy: Policy) -> None:
    gids = allowed_gids(policy.groups)  # rules D2, D4: this host's gids, never a name the image resolves
    for group in value or []:
        gid = number(str(group))
        if gid is None or gid not in gids:
            why = "rule D4: a gid of [gpu_policy] allowed_groups or of this host's video/render groups, in numbers"
            raise _refuse("HostConfig.GroupAdd", group, why)


def _mounts(value: Any, policy: Policy) -> None:
    for mount in value or []:
        _check_mount(fields("HostConfig.Mounts", mount), policy)


JUDGED: dict[str, Callable[[Any, Policy], None]] = {
    "privileged": _no_privilege, "oomkilldisable": _no_privilege, "capadd": _capabilities,
    "securityopt": _security_options, "networkmode": _network_mode, "ipcmode": _ipc_mode, "devices": _devices,
    "devicerequests": _device_requests, "groupadd": _groups, "mounts": _mounts, "logconfig": _log_config,
}  # fmt: skip


def provider_made(source: str, *, writable: bool, policy: Policy) -> bool:
    """Whether a bind source is one the provider makes: a try's files (read-only), or a checkpoint folder.

    The task's files lie in a folder of the state dir's ``docker-tasks`` (private to the worker); a checkpoint folder
    lies beneath a checkpoint root (rule F3). Both are the worker's own: a container running as the worker's user
    gets nothing there that the worker lacks.
    """
    tasks = f"{policy.state_dir.rstrip('/')}/{TASKS_FOLDER}"
    if not writable and beneath(source, tasks) and source != tasks:
        return True
    return any(beneath(source, root) and source != root for root in policy.checkpoint_roots if "://" not in root)


def _check_mount(mount: Mapping[str, Any], policy: Policy) -> None:
    """Rule D5 on one mount, and rule F1 on its source."""
    kind, source = mount.get("type") or "bind", str(mount.get("source") or "")
    _none_but("HostConfig.Mounts.", mount, frozenset({"type", "source", "target", "readonly", "consistency",
                                                       "tmpfsoptions", "volumeoptions"}))  # fmt: skip
    volume = fields("HostConfig.Mounts.VolumeOptions", mount.get("volumeoptions"))
    _none_but("HostConfig.Mounts.VolumeOptions.", volume, frozenset({"nocopy", "labels"}))  # no driver options
    if kind == "tmpfs":
        return
    if kind == "volume":
        if source not in policy.volumes:
            raise UnsafePathError(f"the volume {source!r}", "rule D5: [gpu_policy] allowed_volumes lacks it")
        if volume.get("nocopy") is not True:  # else the engine fills an empty volume from the image (copy-up)
            raise UnsafePathError(f"the volume {source!r}", "rule D5: mounted without copy-up only (NoCopy)")
        return
    if kind != "bind":
        raise UnsafePathError(f"the mount {dict(mount)!r}", "only bind, volume and tmpfs mounts are known")
    writable = not mount.get("readonly")
    if not provider_made(canonical(source), writable=writable, policy=policy):
        found = _mount_problem(source, writable=writable, policy=policy)
        if found:
            raise UnsafePathError(source, f"{found[0]} ([gpu] {found[1]})")
    stable(source)  # rule F1: the engine resolves this name again when it starts the container


def check_volume(found: Mapping[str, Any] | None, name: str) -> None:
    """A listed volume the engine has: a plain local one, whose options make it no bind or network mount.

    ``None`` (no such volume yet): the engine makes a plain local one.

    :raises UnsafePathError: for another driver or any driver option (``type``, ``o``, ``device``)
    """
    if found is None:
        return
    volume = fields("volume", found)
    if volume.get("driver") != "local" or volume.get("options"):
        why = f"driver {volume.get('driver')!r} with options {volume.get('options')!r}: it mounts another place"
        raise UnsafePathError(f"the volume {name!r}", f"{why}; only plain local volumes")
