"""The authorization plugin's decisions, call by call, and its protocol on a real unix socket (no engine needed).

The engine's side is in tests/backends/docker/test_docker_authz.py (a second engine with the plugin).
"""

from __future__ import annotations

import base64
import grp
import http.client
import io
import json
import os
import pwd
import socket
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from conftest import REPO

from airflow_gpu_provider.backends.docker.files import TaskFiles
from airflow_gpu_provider.policy import Policy
from airflow_gpu_provider.policy.authz.archive import check_archive
from airflow_gpu_provider.policy.authz.endpoints import decide
from airflow_gpu_provider.policy.docker import worker_user
from airflow_gpu_provider.policy.paths import UnsafePathError

ID = "c" * 64
SAFE = {"User": worker_user(), "HostConfig": {"CapDrop": ["ALL"], "SecurityOpt": ["no-new-privileges:true"]}}


def ask(method: str, uri: str, body: object = None, *, raw: bytes | None = None, content_type: str = "",
        containers: dict | None = None) -> tuple[bool, str]:  # fmt: skip
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = {
        "RequestMethod": method,
        "RequestUri": uri,
        "RequestHeaders": {"Content-Type": content_type or ("application/json" if data else "")},
        "RequestBody": base64.b64encode(data).decode() if data else None,
    }
    return decide(request, Policy.current(), (containers or {}).get)


@pytest.mark.parametrize(
    ("method", "uri"),
    [  # every call the provider, docker-py and the docker CLI make for the provider's tasks and builds
        ("HEAD", "/_ping"), ("GET", "/v1.41/_ping"), ("GET", "/version"), ("GET", "/v1.41/info"), ("POST", "/auth"),
        ("GET", "/v1.41/images/airflow-gpu-base:bookworm/json"), ("GET", "/v1.41/images/json?all=1"),
        ("GET", "/v1.41/containers/json?all=1&filters=%7B%7D"), ("GET", f"/v1.41/containers/{ID}/json"),
        ("POST", f"/v1.41/containers/{ID}/start"), ("POST", f"/v1.41/containers/{ID}/wait"),
        ("POST", f"/v1.41/containers/{ID}/attach?stream=1"), ("POST", f"/v1.41/containers/{ID}/stop?t=30"),
        ("GET", f"/v1.41/containers/{ID}/logs?follow=1"), ("GET", f"/v1.41/containers/{ID}/archive?path=%2Ftmp"),
        ("DELETE", f"/v1.41/containers/{ID}?force=True"), ("POST", "/v1.41/build?t=x%3A1&rm=1&forcerm=1"),
        ("POST", "/v1.41/images/create?fromImage=reg.example.com%2Fx&tag=1"), ("POST", "/v1.41/images/reg:5000/x/push"),
        ("DELETE", "/v1.41/images/sha256:abc?noprune=1"), ("POST", "/v1.41/images/load"), ("GET", "/v1.41/events"),
        ("POST", f"/v1.41/exec/{ID}/start"), ("GET", "/v1.41/volumes"), ("GET", "/v1.41/networks"),
        ("PUT", f"/v1.41/containers/{ID}/archive?path=%2F"),  # into a container without a writable host folder
    ],
)  # fmt: skip
def test_every_call_the_provider_makes_is_allowed(method, uri):
    assert ask(method, uri, containers={ID: {"Id": ID, "Mounts": []}}) == (True, "")


@pytest.mark.parametrize(
    ("method", "uri", "body", "reason"),
    [
        ("POST", "/v1.41/plugins/pull?remote=x", None, "swarm, plugins"),
        ("POST", "/v1.41/plugins/x/enable", None, "swarm, plugins"),
        ("POST", "/v1.41/swarm/init", {}, "swarm, plugins"), ("GET", "/v1.41/secrets", None, "swarm, plugins"),
        ("POST", "/v1.41/services/create", {}, "swarm, plugins"),
        ("POST", "/v1.41/networks/create", {"Name": "n"}, "network of the host's"),
        ("POST", "/v1.41/networks/host/connect", {"Container": ID}, "network of the host's"),
        ("POST", f"/v1.41/containers/{ID}/rename?name=x", None, "redirect calls"),
        ("POST", f"/v1.41/containers/create?name={'a' * 64}", SAFE, "named like a container id"),
        ("POST", "/v1.41/build?networkmode=host", None, "allowed_network_modes"),
        ("POST", "/v1.41/build?cgroupparent=%2F", None, "cgroupparent"),
        ("POST", "/v1.41/build?remote=git%3A%2F%2Fx", None, "remote"),
        ("POST", "/v1.41/session", None, "does not know"), ("POST", "/grpc", None, "does not know"),
        ("GET", "/v1.23/containers/json", None, "older than 1.24"),
        ("GET", "/v1.41/containers/%6Aso%6E", None, "does not know"),  # encoded: read otherwise by the engine
        ("GET", "/v1.41/containers/../info", None, "does not know"), ("GET", "http://x/v1.41/info", None, "not know"),
        ("POST", "/v1.41/containers/create", None, "did not show the plugin"),  # CVE-2024-41110: no body seen
        ("POST", f"/v1.41/containers/{ID}/exec", {"Cmd": ["id"], "Privileged": True}, "nothing privileged"),
        ("POST", f"/v1.41/containers/{ID}/exec", {"Cmd": ["id"], "User": "4242"}, "rule D2"),
        ("POST", f"/v1.41/containers/{ID}/update", {"Devices": [{"PathOnHost": "/dev/sda"}]}, "only /dev/kfd"),
        ("POST", f"/v1.41/containers/{ID}/update", {"CgroupParent": "/"}, "cgroupparent"),
        ("POST", "/v1.41/volumes/create", {"Name": "r", "DriverOpts": {"type": "none", "o": "bind", "device": "/"}},
         "driver options"),
        ("POST", "/v1.41/volumes/create", {"Name": "r", "Driver": "sshfs"}, "driver"),
    ],
)  # fmt: skip
def test_what_reaches_the_host_and_what_the_plugin_does_not_know_is_refused(method, uri, body, reason):
    allowed, why = ask(method, uri, body)
    assert not allowed and reason in why, why


def test_a_body_is_read_as_the_engines_go_reader_reads_it():
    assert ask("POST", "/v1.41/containers/create", SAFE | {"Image": "x"}) == (True, "")
    text = json.dumps(SAFE)
    twice = text[:-1] + ', "HostConfig": {"Privileged": true}}'  # Go would merge both HostConfig objects
    for raw, reason in [
        (twice.encode(), "named twice"),
        (text.replace('"User"', '"User": "0:0", "user"').encode(), "named twice"),  # case-folded: one field to Go
        (b'{"User": NaN}', "not JSON"), (b"[1]", "not a JSON object"), (b"\xff\xfe{}", "strict JSON"),
        (json.dumps({**SAFE, "Privileged": True}).encode(), "privileged"),  # read at the top when no HostConfig
    ]:  # fmt: skip
        allowed, why = ask("POST", "/v1.41/containers/create", raw=raw)
        assert not allowed and reason in why, (raw, why)
    assert ask("POST", "/v1.41/build?q=1", content_type="application/x-www-form-urlencoded")[1].endswith(
        "parameters in a form body or after ';' are read by the engine but not shown to the plugin"
    )


def _other_digits(number: int) -> str:
    """A number in Arabic-Indic digits: a digit to Python's ``int``, a name to the engine's ``strconv.Atoi``."""
    return "".join(chr(0x660 + int(digit)) for digit in str(number))


def test_h2_any_client_gets_numbers_checked_never_a_name_the_image_resolves(monkeypatch):
    """Rule D2 and D4 on a raw client's body: the user as ``uid:gid`` of the worker's own or a listed pair, groups as
    listed gids of this host. A name (``alice``, ``alice:0``), a uid without its gid or digits the engine reads as a
    name would be resolved in the image's own ``/etc/passwd`` and ``/etc/group``, where they may be root.
    """
    nobody, video = pwd.getpwnam("nobody"), grp.getgrnam("video").gr_gid
    monkeypatch.setenv(
        "AIRFLOW__GPU_POLICY__ALLOWED_USERS", "nobody, alice"
    )  # alice: no user of this host, allows nothing
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_GROUPS", "nogroup")
    gpu = {**SAFE["HostConfig"], "DeviceRequests": [{"Capabilities": [["gpu"]], "Count": 1}]}  # reaches the host
    create = "/v1.41/containers/create"
    for user in (worker_user(), f"{nobody.pw_uid}:{nobody.pw_gid}"):
        assert ask("POST", create, {**SAFE, "User": user, "HostConfig": gpu}) == (True, ""), user
    for user in ("alice", "alice:0", "nobody", "nobody:0", f"{nobody.pw_uid}", f"{nobody.pw_uid}:0", "",
                 ":".join(map(_other_digits, (os.geteuid(), os.getegid()))), f"+{nobody.pw_uid}:{nobody.pw_gid}"):  # fmt: skip
        allowed, why = ask("POST", create, {**SAFE, "User": user, "HostConfig": gpu})
        assert not allowed and "rule D2" in why and "never a name" in why, (user, why)
        allowed, why = ask("POST", f"/v1.41/containers/{ID}/exec", {"Cmd": ["id"], "User": user or "nobody"})
        assert not allowed and "rule D2" in why, (user, why)
    gids = [str(video), str(grp.getgrnam("nogroup").gr_gid)]
    assert ask("POST", create, {**SAFE, "HostConfig": {**gpu, "GroupAdd": gids}}) == (True, "")
    for group in ("video", "nogroup", "0", "4242", _other_digits(video), f"+{video}"):
        allowed, why = ask("POST", create, {**SAFE, "HostConfig": {**gpu, "GroupAdd": [group]}})
        assert not allowed and "rule D4" in why and "GroupAdd" in why, (group, why)


def _archive(*, mode: int = 0o644, owner: tuple[int, int] | None = None, kind: bytes = tarfile.REGTYPE,
             pax: dict | None = None) -> bytes:  # fmt: skip
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w", format=tarfile.PAX_FORMAT) as archive:
        info = tarfile.TarInfo("ckpt/file")
        info.mode, info.type, info.pax_headers = mode, kind, pax or {}
        info.uid, info.gid = owner or (os.geteuid(), os.getegid())
        if kind == tarfile.SYMTYPE:
            info.linkname = "/etc/shadow"
        archive.addfile(info, io.BytesIO(b"") if kind == tarfile.REGTYPE else None)
    return data.getvalue()


def test_an_upload_into_a_writable_host_folder_is_checked_and_refused_unseen():
    mounted = {ID: {"Id": ID, "Mounts": [{"Type": "bind", "Source": "/x", "Destination": "/ckpt", "RW": True}]}}
    uri = f"/v1.41/containers/{ID}/archive?path=%2F"
    assert ask("PUT", uri, raw=_archive(), containers=mounted) == (True, "")
    for archive, reason in [
        (_archive(mode=0o4755), "setuid"), (_archive(mode=0o666), "world-writable"),
        (_archive(owner=(4242, 4242)), "not the worker's"),
        (_archive(kind=tarfile.CHRTYPE), "device"), (_archive(kind=tarfile.SYMTYPE), "link"),
        (_archive(pax={"uid": "0"}), "pax"), (b"\x1f\x8b" + b"\x00" * 100, "plain tar"),
    ]:  # fmt: skip
        allowed, why = ask("PUT", uri, raw=archive, containers=mounted)
        assert not allowed and reason in why, why
    assert "did not show the plugin" in ask("PUT", uri, containers=mounted)[1]  # x-tar: not shown, refused
    assert "full id" in ask("PUT", "/v1.41/containers/name/archive?path=%2F", containers=mounted)[1]
    assert "no container" in ask("PUT", uri, raw=_archive())[1]


def test_the_providers_own_upload_is_one_the_plugin_accepts(tmp_path):
    from airflow_gpu_provider.task import runtime_zip

    mounted = {"envelope.json": b"{}", "runtime.pyz": runtime_zip.compiled("/airflow-gpu/runtime.pyz")}
    with TaskFiles(mounted, parent=tmp_path / "files") as files:
        archive = files.archive()
    check_archive(archive)  # regular files and a folder of the worker's, permission bits only
    assert len(archive) < 2**20  # the engine shows a plugin bodies under 1 MiB only
    assert runtime_zip.archive() in archive  # the runtime uploaded as its plain archive, the smaller one
    with pytest.raises(UnsafePathError, match="setuid"):
        check_archive(_archive(mode=0o2755))


def test_the_plugin_speaks_the_engines_protocol_on_its_socket(tmp_path):
    """``airflow-gpu-docker-authz`` as the engine starts it (the console script): activation, a request, a response."""
    script = 'airflow-gpu-docker-authz = "airflow_gpu_provider.policy.authz.__main__:main"'
    assert script in (REPO / "pyproject.toml").read_text()  # [project.scripts]
    path = tmp_path / "airflow-gpu.sock"
    args = ["--socket", str(path), *(["--user", f"{os.geteuid()}:{os.getegid()}"] if os.geteuid() == 0 else [])]
    plugin = subprocess.Popen([sys.executable, "-m", "airflow_gpu_provider.policy.authz", *args],
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        answers = {}
        while not answers and time.monotonic() < deadline:
            try:
                answers["activate"] = _post(path, "/Plugin.Activate", {})
            except OSError:
                time.sleep(0.1)
        privileged = {**SAFE, "HostConfig": {**SAFE["HostConfig"], "Privileged": True}}
        body = base64.b64encode(json.dumps(privileged).encode()).decode()
        request = {"RequestMethod": "POST", "RequestUri": "/v1.41/containers/create",
                   "RequestHeaders": {"Content-Type": "application/json"}, "RequestBody": body}  # fmt: skip
        answers["request"] = _post(path, "/AuthZPlugin.AuthZReq", request)
        answers["response"] = _post(path, "/AuthZPlugin.AuthZRes", {**request, "ResponseStatusCode": 201})
    finally:
        plugin.terminate()
        _, log = plugin.communicate(timeout=30)
    assert answers["activate"] == {"Implements": ["authz"]}, log
    assert answers["request"]["Allow"] is False and "nothing privileged" in answers["request"]["Msg"]
    assert answers["response"] == {"Allow": True}
    assert plugin.returncode == 0 and not path.exists()  # stopped by SIGTERM, its socket removed


def _post(path: Path, call: str, payload: dict) -> dict:
    connection = http.client.HTTPConnection("localhost", timeout=30)
    connection.sock = socket.socket(socket.AF_UNIX)
    connection.sock.connect(str(path))
    try:
        connection.request("POST", call, json.dumps(payload), {"Content-Type": "application/json"})
        return dict(json.loads(connection.getresponse().read()))
    finally:
        connection.close()
