"""Which Engine API calls the plugin allows: every endpoint the provider uses, the rest of the host's never.

One table, :data:`ENDPOINTS`: an endpoint is allowed, judged (the create body by ``policy/engine.py``, the same
function as the provider's final check; an exec, an update, a volume, a build, an upload) or refused; an endpoint the
table does not name is refused (default deny). A judgement that needs the request's body refuses the call when the
engine did not show it (a body that is not ``application/json``, is chunked or over 1 MiB: CVE-2024-41110's lesson).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from airflow_gpu_provider.policy import Policy
from airflow_gpu_provider.policy.authz.archive import check_archive
from airflow_gpu_provider.policy.engine import check_create, check_exec, check_host_config, empty, fields
from airflow_gpu_provider.policy.paths import UnsafePathError

MIN_VERSION = (1, 24)  # older API versions take a HostConfig when a container starts, which no plugin judges
FULL_ID = re.compile(r"[0-9a-f]{64}")
PATH = re.compile(r"(?:/v(?P<version>[0-9]+\.[0-9]+))?(?P<path>/[A-Za-z0-9._:/@+-]*)")
FORMS = ("application/x-www-form-urlencoded", "multipart/form-data")  # the engine reads parameters from such bodies
#: The engine's lookup of a container, by id: its inspect JSON, or ``None`` when there is none.
Containers = Callable[[str], "Mapping[str, Any] | None"]


class Refused(Exception):
    """The plugin's answer: the call is refused, and why."""


@dataclass(frozen=True)
class Call:
    """One API call, as the engine showed it to the plugin."""

    method: str
    path: str
    query: dict[str, list[str]]
    body: bytes | None  # None: the engine did not show one
    policy: Policy
    containers: Containers
    match: re.Match[str]

    def needs_body(self) -> bytes:
        """The body; refused when the engine did not show it (fail closed)."""
        if not self.body:
            raise Refused("the engine did not show the plugin this call's body (it shows only application/json "
                          "bodies under 1 MiB), and the decision needs it")  # fmt: skip
        return self.body

    def json(self) -> dict[str, Any]:
        """The body as a JSON object, read strictly (no name twice, no ``NaN``), as the engine's Go reader reads it."""
        try:
            value = json.loads(self.needs_body().decode("utf-8"), object_pairs_hook=_once, parse_constant=_no)
        except (ValueError, UnicodeDecodeError) as err:
            raise Refused(f"the body is not the strict JSON the engine reads ({err})") from None
        if not isinstance(value, dict):
            raise Refused("the body is not a JSON object")
        return value

    def value(self, name: str) -> list[str]:
        """Every value of a query parameter (the engine takes the first; each is judged)."""
        return self.query.get(name, [])


def _once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, value in pairs:
        if name in found:
            raise ValueError(f"{name!r} is named twice (the engine would merge the two)")
        found[name] = value
    return found


def _no(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")


def _create(call: Call) -> None:
    _no_id_like_name(call.value("name"))
    check_create(call.json(), call.policy)


def _no_id_like_name(names: list[str]) -> None:
    if any(FULL_ID.fullmatch(name.lstrip("/")) for name in names):
        raise Refused("a container named like a container id would redirect a later call on that id")


def _exec(call: Call) -> None:
    check_exec(call.json(), call.policy)


def _update(call: Call) -> None:  # a running container's resources: nothing its create call could not have
    members = fields("update", call.json())
    members.pop("restartpolicy", None)
    check_host_config(members, call.policy)


def _volume(call: Call) -> None:  # a named volume with driver options mounts whatever the driver is told (local: /)
    members = fields("volume", call.json())
    if members.get("driver") not in (None, "", "local") or not empty(members.get("driveropts")):
        raise Refused("a volume with a driver or driver options reaches the host; only plain local volumes")
    if not all(empty(value) for key, value in members.items() if key not in ("name", "labels", "driver")):
        raise Refused(f"volume fields beyond Name and Labels are refused: {sorted(members)}")


def _upload(call: Call) -> None:
    container_id = call.match["id"]
    if not FULL_ID.fullmatch(container_id):
        raise Refused("an upload must name the container by its full id")
    found = call.containers(container_id)
    if found is None or found.get("Id") != container_id:
        raise Refused(f"no container {container_id[:12]} on this engine")
    writable = [m for m in found.get("Mounts") or [] if m.get("Type") == "bind" and m.get("RW")]
    if writable:  # unpacked as root into a host folder: only what the container's own user could write
        check_archive(call.needs_body())


def _build(call: Call) -> None:
    modes = set(call.value("networkmode")) - {"", "default"}
    if modes - call.policy.network_modes:
        raise Refused(f"a build on network {sorted(modes)}: [gpu_policy] allowed_network_modes lacks it (rule D3)")
    for name in ("cgroupparent", "securityopt", "remote", "session", "outputs"):
        if any(call.value(name)):
            raise Refused(f"a build's {name} is refused (a cgroup, security option, remote context or BuildKit "
                          "session the plugin cannot judge)")  # fmt: skip
    if set(call.value("isolation")) - {"", "default"} or set(call.value("version")) - {"", "1"}:
        raise Refused("a build with another isolation or builder than the engine's classic default")


HOST = "it reaches the host, and the provider never uses it"
ID = r"(?P<id>[A-Za-z0-9][A-Za-z0-9_.-]*)"
NAME = r"(?P<name>[A-Za-z0-9][A-Za-z0-9._:/@+-]*)"
Rule = Callable[[Call], None] | str | None  # judged, refused (why), or allowed
ENDPOINTS: tuple[tuple[str, str, Rule], ...] = (
    ("GET HEAD", "/_ping", None), ("GET", "/(version|info|events|system/df)", None), ("POST", "/auth", None),
    ("GET", "/containers/json", None), ("POST", "/containers/create", _create),
    ("GET", f"/containers/{ID}/(json|top|logs|changes|export|stats|attach/ws)", None),
    ("GET HEAD", f"/containers/{ID}/archive", None), ("PUT", f"/containers/{ID}/archive", _upload),
    ("POST", f"/containers/{ID}/(start|stop|restart|kill|pause|unpause|wait|resize|attach)", None),
    ("POST", f"/containers/{ID}/update", _update), ("POST", f"/containers/{ID}/exec", _exec),
    ("POST", f"/containers/{ID}/rename", "a container renamed like another's id would redirect calls on that id"),
    ("DELETE", f"/containers/{ID}", None), ("POST", "/containers/prune", None),
    ("POST", f"/exec/{ID}/(start|resize)", None), ("GET", f"/exec/{ID}/json", None),
    ("GET", "/images/(json|search|get)", None), ("GET", f"/images/{NAME}/(json|history|get)", None),
    ("POST", "/images/(create|load|prune)", None), ("POST", f"/images/{NAME}/(tag|push)", None),
    ("DELETE", f"/images/{NAME}", None), ("POST", "/build", _build), ("POST", "/build/(prune|cancel)", None),
    ("POST", "/commit", None), ("GET", f"/distribution/{NAME}/json", None),
    ("GET", "/volumes", None), ("GET", f"/volumes/{NAME}", None), ("POST", "/volumes/create", _volume),
    ("DELETE", f"/volumes/{NAME}", None), ("POST", "/volumes/prune", None),
    ("GET", "/networks", None), ("GET", f"/networks/{ID}", None), ("DELETE", f"/networks/{ID}", None),
    ("POST", "/networks/prune", None),
    ("POST", f"/networks/(create|{ID}/(connect|disconnect))", f"a network of the host's: {HOST}"),
    ("GET", f"/plugins(|/privileges|/{NAME}/json)", None),
    ("GET POST PUT DELETE", "/(plugins|swarm|nodes|services|tasks|secrets|configs)(/.*)?", f"swarm, plugins: {HOST}"),
)  # fmt: skip
_COMPILED = [(frozenset(methods.split()), re.compile(pattern), rule) for methods, pattern, rule in ENDPOINTS]


def decide(request: Mapping[str, Any], policy: Policy, containers: Containers) -> tuple[bool, str]:
    """The answer to one ``/AuthZPlugin.AuthZReq``: ``(allowed, why)``, default deny."""
    method, uri = str(request.get("RequestMethod") or ""), str(request.get("RequestUri") or "")
    shown = f"{method} {uri.partition('?')[0]}"
    try:
        found = _call(method, uri, request, policy, containers)
        if found is None:
            return False, f"{shown}: an endpoint the plugin does not know (default deny)"
        call, rule = found
        if isinstance(rule, str):
            return False, f"{shown}: {rule}"
        if rule is not None:
            rule(call)
    except (Refused, UnsafePathError) as err:
        return False, f"{shown}: {err}"
    return True, ""


def _call(
    method: str, uri: str, request: Mapping[str, Any], policy: Policy, containers: Containers
) -> tuple[Call, Rule] | None:
    """The call and its rule, or ``None`` for an endpoint the table does not name.

    :raises Refused: when the engine would read the call otherwise than the plugin can (an old API version,
        parameters in a form body)
    """
    target, _, query = uri.partition("?")
    found = PATH.fullmatch(target)
    if found is None or "//" in target or "/./" in f"{target}/" or "/../" in f"{target}/":
        return None
    version = found["version"]
    if version is not None and tuple(int(part) for part in version.split(".")) < MIN_VERSION:
        raise Refused(f"API version {version} is older than {MIN_VERSION[0]}.{MIN_VERSION[1]}")
    if ";" in query or _content_type(request).startswith(FORMS):
        raise Refused("parameters in a form body or after ';' are read by the engine but not shown to the plugin")
    body = base64.b64decode(request["RequestBody"]) if request.get("RequestBody") else None
    path = found["path"]
    for methods, pattern, rule in _COMPILED:
        match = pattern.fullmatch(path)
        if method in methods and match is not None:
            query_values = parse_qs(query, keep_blank_values=True)
            return Call(method, path, query_values, body, policy, containers, match), rule
    return None


def _content_type(request: Mapping[str, Any]) -> str:
    headers = request.get("RequestHeaders") or {}
    found = [str(value) for name, value in headers.items() if str(name).lower() == "content-type"]
    return found[-1].strip().lower() if found else ""
