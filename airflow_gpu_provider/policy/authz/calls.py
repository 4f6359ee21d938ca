"""Every Engine API call the provider makes, in the exact form its client writes it: the plugin allows no other.

The provider reaches the engine through docker-py (``DockerHook``), which writes each call one way. A call is
allowed only when it matches one of :data:`FORMS` whole (recorded from the provider's own calls across the Docker
tests; ``tests/policy/test_authz_plugin.py`` checks that the table holds those and nothing else):

- its method, and its path after an API version prefix of 1.41 or later (the version whose defaults the policy
  assumes: the engine's own cgroup namespace, a private IPC namespace, no HostConfig at start), or none for the one
  call docker-py sends without (``GET /version``, answered in the engine's newest version); no ``%`` in the path;
- its query: parameters from the form's names, each at most once, written only with the characters docker-py's
  encoding writes (``%XX`` in capitals, ``+`` for a space), each value of the form's shape, no ``;``;
- its headers: no ``Transfer-Encoding``; without a body (or an upload), no ``Content-Type`` and a zero or absent
  ``Content-Length``; with a JSON body, ``Content-Type`` exactly ``application/json`` and the body shown to the
  plugin. The engine shows a plugin the body when the FIRST ``Content-Type`` is JSON, hands it the LAST value of
  each header, and Go reads a form from the body by the FIRST: a form body is never shown, so the plugin sees either
  no ``Content-Type`` (refused where a body is allowed) or no body (refused); a shown body had a JSON first value,
  which Go never reads as a form. Whatever the order, no hidden form can override a parameter (H2 of issue 34);
- a JSON body's fields: exactly the names, case and types docker-py writes, none unknown, none twice.

Anything else is refused, however harmless it looks: then no difference between the plugin's readers and the
engine's can matter. What a matching call may do is judged next (``judge.py``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import unquote_plus

NONE, JSON, UPLOAD, HIDDEN = "none", "json", "upload", "hidden"  # a body: none, JSON shown, a tar, JSON never shown
MIN_VERSION = (1, 41)
VERSIONED = re.compile(r"/v(?P<major>1)\.(?P<minor>[1-9][0-9])(?P<path>/.*)")
COMMON_HEADERS = frozenset({"user-agent", "accept", "accept-encoding", "connection", "content-length"})
PARAMETER = re.compile(r"(?P<name>[a-zA-Z_]+)=(?P<value>(?:[A-Za-z0-9._~+-]|%[0-9A-F]{2})*)")
FULL_ID = r"(?P<id>[0-9a-f]{64})"
IMAGE = r"(?P<name>[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254})"
BOOL, FLAG = "True|False", "0|1"
STR, INT, BOOLEAN = "str", "int", "bool"  # JSON scalar types


class Refused(Exception):
    """The plugin's answer: the call is refused, and why."""


@dataclass(frozen=True)
class Obj:
    """A JSON object with exactly these fields (each optional), case and all: ``name -> shape``."""

    fields: Mapping[str, Any]


@dataclass(frozen=True)
class MapOf:
    """A JSON object of any string keys, each value of ``shape`` (labels, options)."""

    shape: Any


@dataclass(frozen=True)
class ListOf:
    """A JSON list, each item of ``shape``."""

    shape: Any


MOUNT = Obj({"Target": STR, "Source": STR, "Type": STR, "ReadOnly": BOOLEAN, "VolumeOptions": Obj({"NoCopy": BOOLEAN})})
HOST_CONFIG = Obj({
    "NetworkMode": STR, "CapDrop": ListOf(STR), "CapAdd": ListOf(STR), "SecurityOpt": ListOf(STR),
    "Mounts": ListOf(MOUNT), "GroupAdd": ListOf(STR), "NanoCpus": INT, "Memory": INT, "MemorySwap": INT,
    "IpcMode": STR, "ShmSize": INT, "Privileged": BOOLEAN,
    "DeviceRequests": ListOf(Obj({"Driver": STR, "Count": INT, "DeviceIDs": ListOf(STR),
                                  "Capabilities": ListOf(ListOf(STR)), "Options": MapOf(STR)})),
    "Ulimits": ListOf(Obj({"Name": STR, "Soft": INT, "Hard": INT})),
    "Devices": ListOf(Obj({"PathOnHost": STR, "PathInContainer": STR, "CgroupPermissions": STR})),
})  # fmt: skip
CREATE = Obj({
    "User": STR, "Tty": BOOLEAN, "OpenStdin": BOOLEAN, "StdinOnce": BOOLEAN, "AttachStdin": BOOLEAN,
    "AttachStdout": BOOLEAN, "AttachStderr": BOOLEAN, "Env": ListOf(STR), "Cmd": ListOf(STR), "Image": STR,
    "NetworkDisabled": BOOLEAN, "Entrypoint": ListOf(STR), "WorkingDir": STR, "Labels": MapOf(STR),
    "HostConfig": HOST_CONFIG,
})  # fmt: skip
COMMIT = Obj({"Env": ListOf(STR), "Labels": MapOf(STR), "Entrypoint": ListOf(STR), "Cmd": ListOf(STR), "User": STR,
              "WorkingDir": STR})  # fmt: skip
EMPTY = Obj({})  # docker-py's push writes "{}"; a registry login's body is never shown to a plugin


class Form(NamedTuple):
    """One call of the provider's, as its client writes it.

    :param target: what the path names, judged as the engine has it: ``container`` (inspect: its label only),
        ``container+`` (every other call on it), ``image``, or ``None``
    """

    what: str
    method: str
    path: str
    query: Mapping[str, str] = {}
    body: str = NONE
    schema: Any = None
    headers: frozenset[str] = frozenset()
    target: str | None = None
    unversioned: bool = False


LABEL_FILTER = r'\{"label": \["[A-Za-z0-9._=:/-]+"(, "[A-Za-z0-9._=:/-]+")*\]\}'
IMAGE_FILTERS = r'\{("dangling": \["true"\], )?"label": \["[A-Za-z0-9._=:/-]+"\](, "dangling": \["true"\])?\}'
FORMS: tuple[Form, ...] = (
    Form("ping", "GET", "/_ping"),
    Form("the engine's version", "GET", "/version", unversioned=True),
    Form("the engine's facts", "GET", "/info"),  # rootless? limits enforced? (backends/docker/engine_facts.py)
    # DockerHook's login, where docker_conn_id names a registry (no test has one)
    Form("a registry login", "POST", "/auth", body=HIDDEN, headers=frozenset({"content-type"})),
    Form("list containers", "GET", "/containers/json",
         {"all": FLAG, "limit": "-1", "size": FLAG, "trunc_cmd": FLAG, "filters": LABEL_FILTER}),
    Form("create a container", "POST", "/containers/create", body=JSON, schema=CREATE),
    Form("inspect a container", "GET", f"/containers/{FULL_ID}/json", target="container"),
    Form("start a container", "POST", f"/containers/{FULL_ID}/start", target="container+"),
    Form("attach to a container", "POST", f"/containers/{FULL_ID}/attach",
         {"stdout": FLAG, "stderr": FLAG, "stream": FLAG, "logs": FLAG}, headers=frozenset({"upgrade"}),
         target="container+"),
    Form("wait for a container", "POST", f"/containers/{FULL_ID}/wait", target="container+"),
    Form("stop a container", "POST", f"/containers/{FULL_ID}/stop", {"t": "[0-9]{1,6}"}, target="container+"),
    Form("remove a container", "DELETE", f"/containers/{FULL_ID}", {"v": BOOL, "link": BOOL, "force": BOOL},
         target="container+"),
    Form("read a container's log", "GET", f"/containers/{FULL_ID}/logs",
         {"stderr": FLAG, "stdout": FLAG, "timestamps": FLAG, "follow": FLAG, "tail": "all|[0-9]{1,6}",
          "since": r"[0-9]{1,12}(\.[0-9]{1,9})?"}, target="container+"),
    # what the provider reads back: a build's installed packages (images/install.py), and the result file of a task
    # container of 0.1.0 (upgrade; ours print their result on their output: backends/docker/lifecycle.py)
    Form("copy from a container", "GET", f"/containers/{FULL_ID}/archive",
         {"path": r"/opt/airflow-gpu/site-packages|/tmp/airflow-gpu-result\.json"}, target="container+"),
    Form("copy into a container", "PUT", f"/containers/{FULL_ID}/archive", {"path": "/"}, body=UPLOAD,
         target="container+"),
    Form("commit a container", "POST", "/commit",
         {"container": FULL_ID, "repo": r"[a-z0-9][a-z0-9._/:-]{0,254}", "tag": "[0-9a-f]{16}", "pause": BOOL},
         body=JSON, schema=COMMIT, target="container+"),
    Form("list images", "GET", "/images/json", {"all": FLAG, "only_ids": FLAG, "filters": IMAGE_FILTERS}),
    Form("inspect an image", "GET", f"/images/{IMAGE}/json"),
    Form("pull an image", "POST", "/images/create",
         {"fromImage": r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}", "tag": r"[A-Za-z0-9_][A-Za-z0-9._:-]{0,127}"}),
    Form("push an image", "POST", f"/images/{IMAGE}/push", {"tag": "[0-9a-f]{16}"}, body=JSON, schema=EMPTY,
         target="image"),
    Form("remove an image", "DELETE", f"/images/{IMAGE}", {"force": "False", "noprune": BOOL}, target="image"),
)  # fmt: skip


class Call(NamedTuple):
    """A call that matched its form: the path's parts, the query's values, the JSON body."""

    form: Form
    path: Mapping[str, str]
    query: Mapping[str, str]
    body: Any


def match(request: Mapping[str, Any], body: bytes | None) -> Call:
    """The form ``request`` (an ``AuthZReq``) is written in, with what it says.

    :param body: the body the engine showed (``None``: none)
    :raises Refused: naming what is not the provider's form
    """
    method, uri = str(request.get("RequestMethod") or ""), str(request.get("RequestUri") or "")
    target, question, query = uri.partition("?")
    versioned = VERSIONED.fullmatch(target)
    if versioned is not None:
        if (int(versioned["major"]), int(versioned["minor"])) < MIN_VERSION:
            raise Refused(f"API version 1.{versioned['minor']} is older than 1.41, whose defaults the policy assumes")
        target = versioned["path"]
    if "%" in target or "//" in target or "/." in target:
        raise Refused("an encoded, doubled or dotted path is not the provider's form")
    for form in FORMS:
        found = re.fullmatch(form.path, target)
        if form.method == method and found is not None and (versioned is not None or form.unversioned):
            values = _query(form, query if question else None)
            _headers(form, request.get("RequestHeaders") or {}, body)
            return Call(form, found.groupdict(), values, _body(form, body))
    raise Refused("not a call the provider makes (the plugin allows no other)")


def _query(form: Form, query: str | None) -> dict[str, str]:
    if query is None:
        return {}
    values: dict[str, str] = {}
    for part in query.split("&"):
        found = PARAMETER.fullmatch(part)
        if found is None:
            raise Refused(f"the query's {part!r} is not written as the provider's client writes it")
        name, value = found["name"], unquote_plus(found["value"])
        if name in values or name not in form.query or not re.fullmatch(form.query[name], value):
            raise Refused(f"the query's {name}={value!r} is not the provider's (once each, of {sorted(form.query)})")
        values[name] = value
    return values


def _headers(form: Form, headers: Mapping[str, Any], body: bytes | None) -> None:
    named = {str(name).lower(): str(value) for name, value in headers.items()}
    unknown = set(named) - COMMON_HEADERS - form.headers - ({"content-type"} if form.body == JSON else set())
    if unknown:
        raise Refused(f"headers the provider's client does not send: {sorted(unknown)}")
    if form.body == JSON and (named.get("content-type") != "application/json" or not body):
        raise Refused("a JSON body must be 'application/json' and shown to the plugin (it shows no form body)")
    if form.body == NONE and (body or named.get("content-length", "0") != "0"):
        raise Refused("a call without a body must have none")
    if form.body == HIDDEN and named.get("content-type") != "application/json":
        raise Refused("a registry login is 'application/json'")


def _body(form: Form, body: bytes | None) -> Any:
    if form.body != JSON:
        return None
    try:
        value = json.loads(body or b"", object_pairs_hook=_once, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as err:
        raise Refused(f"the body is not the strict JSON the provider writes ({err})") from None
    _shaped(value, form.schema, "body")
    return value


def _once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, value in pairs:
        if name in found:
            raise ValueError(f"{name!r} is named twice")
        found[name] = value
    return found


def _no_constant(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")


def _shaped(value: Any, shape: Any, where: str) -> None:
    """Refuse ``value`` unless it has ``shape``: exact names and case, JSON types as docker-py writes them."""
    if isinstance(shape, Obj):
        if not isinstance(value, dict):
            raise Refused(f"{where} is not a JSON object")
        for name, member in value.items():
            if name not in shape.fields:
                raise Refused(f"{where} has a field the provider does not write: {name!r}")
            _shaped(member, shape.fields[name], f"{where}.{name}")
    elif isinstance(shape, MapOf):
        if not isinstance(value, dict):
            raise Refused(f"{where} is not a JSON object")
        for name, member in value.items():
            _shaped(member, shape.shape, f"{where}[{name!r}]")
    elif isinstance(shape, ListOf):
        if not isinstance(value, list):
            raise Refused(f"{where} is not a JSON list")
        for item in value:
            _shaped(item, shape.shape, f"{where}[]")
    elif {STR: str, INT: int, BOOLEAN: bool}[shape] is not type(value):
        raise Refused(f"{where}={value!r} is not a JSON {shape}")
