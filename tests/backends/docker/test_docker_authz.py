"""The engine enforces the policy, whoever calls it: a second engine with the provider's authorization plugin.

H1 of issue 27: the Docker policy (rules D1-D5) bound only the provider's own create call, while a DAG file's own
code runs in the task process, which holds the socket. Here every API call goes through ``airflow-gpu-docker-authz``
(``authz_engine.py``): the module-level escape is refused by the engine, a client other than the provider gets the
provider's answers for the same bodies, and what the provider never uses that reaches the host is refused. The
provider's own Docker tasks run on this engine in their own tests (``docker_engine``: plain, deferred, derived image,
checkpoint, OOM).
"""

from __future__ import annotations

import grp
import io
import json
import logging
import os
import pwd
import socket
import subprocess
import tarfile
from pathlib import Path

import pytest
from backends.docker.docker_fixtures import BASE_IMAGE
from helpers import start_worker, worker_result

import docker
from airflow_gpu_provider.backends import BACKENDS
from airflow_gpu_provider.backends.docker.files import TaskFiles, upload
from airflow_gpu_provider.backends.docker.lifecycle import create_body
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.policy import Policy
from airflow_gpu_provider.policy.docker import worker_user
from airflow_gpu_provider.policy.engine import check_create
from airflow_gpu_provider.policy.paths import UnsafePathError
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.request import TaskRequest

pytestmark = pytest.mark.docker
DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "docker_escape_dags.py"
DENIED = "authorization denied by plugin airflow-gpu"
SAFE = {"CapDrop": ["ALL"], "SecurityOpt": ["no-new-privileges:true"]}
OWN = worker_user()  # the worker's uid:gid, in numbers
OWN_NAME = pwd.getpwuid(os.geteuid()).pw_name  # the same user by name: the engine would resolve it in the image


def test_h1_a_dag_files_own_docker_call_is_refused_by_the_engine(authz_engine, airflow_home):
    """The module level of a DAG file asks for the host's / and PID namespace: the engine refuses; the DAG's
    ordinary Docker GPU task runs on the same engine, through the same plugin.
    """
    before = {c["Id"] for c in authz_engine.client.containers(all=True)}
    env = {"DOCKER_HOST": authz_engine.url, "AIRFLOW_GPU_TEST_ESCAPE": authz_engine.url}
    worker = start_worker(DAG_FILE, "docker_escape", env=env)
    log, _ = worker.communicate(timeout=240)
    result = worker_result(log)
    assert result.get("states") == {"ordinary": "success"}, log[-5000:]
    escape = result["xcom"]["ordinary"]["escape"]
    assert escape.startswith("refused:") and DENIED in escape and "pidmode='host'" in escape, escape
    assert "H1 module-level escape: refused" in log  # the module level ran, in the worker's process
    assert {c["Id"] for c in authz_engine.client.containers(all=True)} == before  # nothing created, nothing left
    assert "Refused POST /v1.41/containers/create" in authz_engine.plugin_log


def _provider_body(tmp_path: Path) -> dict:
    """The create body the Docker backend would send for a plain task (without its files' mount)."""
    backend = BACKENDS["docker"].create({}, logging.getLogger("t"))
    request = TaskRequest(ResourceSettings(), ImageSettings(parent_image=BASE_IMAGE), Envelope.run(["true"]))
    plan = backend.plan(request, GpuConfig.read())
    with TaskFiles({}, parent=tmp_path / "files") as files:
        files.mounted = False
        return create_body(docker.APIClient(version="1.41"), plan.create_kwargs(BASE_IMAGE), files, plan)


def _bodies(tmp_path: Path) -> dict[str, dict]:
    body = _provider_body(tmp_path)
    host = body["HostConfig"]
    other_user = "1:1" if os.geteuid() == 0 else "0:0"
    folder = {"Mounts": [{"Type": "bind", "Source": str(tmp_path), "Target": "/t", "ReadOnly": True}]}
    other_digits = ":".join("".join(chr(0x660 + int(d)) for d in str(n)) for n in (os.geteuid(), os.getegid()))
    video = grp.getgrnam("video").gr_gid
    return {
        "the provider's own": body,
        "privileged": {**body, "HostConfig": {**host, "Privileged": True}},
        "the host's PID namespace": {**body, "HostConfig": {**host, "PidMode": "host"}},
        "the host's / by Binds": {**body, "HostConfig": {**host, "Binds": ["/:/host"]}},
        "the host's / by Mounts": {**body, "HostConfig": {**host, "Mounts": [{"Type": "bind", "Source": "/",
                                                                               "Target": "/host"}]}},
        "SYS_ADMIN": {**body, "HostConfig": {**host, "CapAdd": ["SYS_ADMIN"]}},
        "/proc unmasked": {**body, "HostConfig": {**host, "MaskedPaths": []}},
        "a raw disk": {**body, "HostConfig": {**host, "Devices": [{"PathOnHost": "/dev/vda", "PathInContainer": "/d",
                                                                   "CgroupPermissions": "rwm"}]}},
        "another user with a host folder": {**body, "User": other_user, "HostConfig": {
            **host, "Mounts": [{"Type": "bind", "Source": str(tmp_path), "Target": "/t", "ReadOnly": True}]}},
        "HostConfig's fields at the top level": {**{k: v for k, v in body.items() if k != "HostConfig"},
                                                  "Privileged": True, **SAFE},
        "a field named twice": {**body, "HostConfig": {**host, "Privileged": False, "privileged": True}},
        "another user, nothing of the host": {**body, "User": other_user},
        # H2: numbers only, resolved on the worker; the image would resolve a name (or digits Go reads as one)
        "the worker's own with a host folder": {**body, "User": OWN, "HostConfig": {**host, **folder}},
        "the worker by name with a host folder": {**body, "User": f"{OWN_NAME}:{os.getegid()}",
                                                  "HostConfig": {**host, **folder}},
        "the worker's ids in other digits with a host folder": {**body, "User": other_digits,
                                                                "HostConfig": {**host, **folder}},
        "the host's video gid": {**body, "HostConfig": {**host, "GroupAdd": [str(video)]}},
        "the video group by name": {**body, "HostConfig": {**host, "GroupAdd": ["video"]}},
        "a gid no one listed": {**body, "HostConfig": {**host, "GroupAdd": ["4242"]}},
    }  # fmt: skip


def test_a_client_other_than_the_provider_gets_the_providers_answers(authz_engine, tmp_path, monkeypatch):
    """The same bodies, sent raw with docker-py: the engine allows exactly what the provider's final check allows,
    and says why it refuses in the check's own words; the docker CLI likewise.
    """
    for name, value in authz_engine.env.items():  # the [gpu] section the plugin reads, for the provider's check
        monkeypatch.setenv(name, value)
    policy, client = Policy.current(), authz_engine.client
    answers = {}
    for name, body in _bodies(tmp_path).items():
        try:
            check_create(body, policy)
            expected = ""
        except UnsafePathError as err:
            expected = str(err)
        try:
            created = client.create_container_from_config(body)["Id"]
            client.remove_container(created, force=True)
            answers[name] = ""
        except docker.errors.APIError as err:
            assert err.status_code == 403 and DENIED in str(err.explanation), (name, err)
            answers[name] = str(err.explanation).split("POST /v1.41/containers/create: ", 1)[1]
        assert answers[name] == expected, (name, answers[name], expected)
    assert {name for name, why in answers.items() if not why} == {
        "the provider's own", "another user, nothing of the host", "the worker's own with a host folder",
        "the host's video gid",
    }, answers  # fmt: skip

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["docker", "-H", authz_engine.url, *args], capture_output=True, text=True, timeout=120)

    allowed = cli("run", "--rm", "--user", OWN, "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                  BASE_IMAGE, "true")  # fmt: skip
    assert allowed.returncode == 0, allowed.stderr
    folder = f"type=bind,src={tmp_path},dst=/t,readonly"
    for refused, why in (
        (["--privileged"], "privileged"), (["-v", "/:/host", "--pid", "host"], "D1-D5"),
        (["--user", "0:0", "-v", "/etc:/e:ro"], "D1-D5"), (["--user", OWN_NAME, "--mount", folder], "rule D2"),
        (["--group-add", "video"], "rule D4"),
    ):  # fmt: skip
        done = cli("run", "--rm", "--cap-drop", "ALL", "--security-opt", "no-new-privileges", *refused, BASE_IMAGE)
        assert done.returncode != 0 and DENIED in done.stderr and why in done.stderr, (refused, done.stderr)


def test_what_reaches_the_host_beyond_a_create_call_is_refused(authz_engine, tmp_path):
    client = authz_engine.client
    safe = client.create_host_config(cap_drop=["ALL"], security_opt=["no-new-privileges:true"])
    container = client.create_container(BASE_IMAGE, ["sleep", "60"], user=OWN, host_config=safe)["Id"]
    try:
        client.start(container)
        client.exec_create(container, ["true"])  # an exec as the container's own user
        client.update_container(container, cpu_shares=512)  # its limits
        refusals = {
            "a privileged exec": lambda: client.exec_create(container, ["id"], privileged=True),
            "an exec as another user": lambda: client.exec_create(container, ["id"], user="4242:4242"),
            "a device added by an update": lambda: client._result(client._post_json(
                client._url("/containers/{0}/update", container),
                data={"Devices": [{"PathOnHost": "/dev/vda", "PathInContainer": "/d", "CgroupPermissions": "rwm"}]})),
            "a rename": lambda: client.rename(container, "renamed"),
            "a name like an id": lambda: client.create_container(BASE_IMAGE, ["true"], name="a" * 64,
                                                                 user=OWN, host_config=safe),
            "a volume of the host's /": lambda: client.create_volume(
                "hostroot", driver_opts={"type": "none", "o": "bind", "device": "/"}),
            "a network": lambda: client.create_network("airflow-gpu-test-net"),
            "a plugin": lambda: client._result(client._post_json(client._url("/plugins/pull"), data=[])),
            "a swarm": client.init_swarm,
            "a build on the host's network": lambda: list(client.build(
                fileobj=_tar({"Dockerfile": b"FROM scratch\n"}), custom_context=True, network_mode="host")),
            "an old API version": lambda: client._result(client.get(f"{client.base_url}/v1.23/containers/json")),
            "an endpoint the plugin does not know": lambda: client._result(client.post(
                f"{client.base_url}/v1.41/session")),
        }  # fmt: skip
        for name, call in refusals.items():
            with pytest.raises(docker.errors.APIError, match=DENIED):
                call()
                pytest.fail(f"{name} was allowed")
        client.remove_volume(client.create_volume("airflow-gpu-test-plain")["Name"])  # a plain volume is fine
    finally:
        client.remove_container(container, force=True)
    # CVE-2024-41110: a body the engine does not show the plugin (over 1 MiB) is a refusal, even for an allowed call;
    # a chunked one is shown (this engine has the fix) or refused, never let through unseen
    body = _provider_body(tmp_path)
    with pytest.raises(docker.errors.APIError, match=f"{DENIED}.*did not show the plugin this call's body"):
        client.create_container_from_config({**body, "Env": [*body["Env"], "PAD=" + "x" * 2**20]})
    privileged = {**body, "HostConfig": {**body["HostConfig"], "Privileged": True}}
    assert _chunked_create(authz_engine.root / "docker.sock", privileged).startswith(b"HTTP/1.1 403")


def _chunked_create(path: Path, body: dict) -> bytes:
    data = json.dumps(body).encode()
    with socket.socket(socket.AF_UNIX) as connection:
        connection.connect(str(path))
        connection.sendall(b"POST /v1.41/containers/create HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json"
                           b"\r\nTransfer-Encoding: chunked\r\n\r\n" + f"{len(data):x}\r\n".encode() + data +
                           b"\r\n0\r\n\r\n")  # fmt: skip
        return connection.recv(4096)


def _tar(files: dict[str, bytes], *, mode: int = 0o644, owner: tuple[int, int] | None = None,
         kind: bytes = tarfile.REGTYPE) -> io.BytesIO:  # fmt: skip
    uid, gid = owner or (os.geteuid(), os.getegid())
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as archive:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid, info.type = len(content), mode, uid, gid, kind
            if kind == tarfile.CHRTYPE:
                info.size, info.devmajor, info.devminor = 0, 1, 3
            archive.addfile(info, io.BytesIO(content) if kind == tarfile.REGTYPE else None)
    data.seek(0)
    return data


def test_an_upload_into_a_writable_host_folder_holds_only_what_the_worker_could_write(authz_engine, tmp_path):
    """The engine unpacks an upload as root, into the container's mounts: a setuid file or a device node would land
    in the host folder as root's. The plugin refuses any upload it cannot see there, and checks the one it can.
    """
    client = authz_engine.client
    folder = tmp_path / "checkpoint"  # beneath a checkpoint root of the plugin's (pytest's temporary root)
    folder.mkdir()
    host_config = client.create_host_config(cap_drop=["ALL"], security_opt=["no-new-privileges:true"],
                                            mounts=[docker.types.Mount("/ckpt", str(folder), type="bind")])  # fmt: skip
    mounted = client.create_container(BASE_IMAGE, ["true"], user=OWN, host_config=host_config)["Id"]
    bare = client.create_container(BASE_IMAGE, ["true"], user=OWN, host_config=client.create_host_config(
        cap_drop=["ALL"], security_opt=["no-new-privileges:true"]))["Id"]  # fmt: skip
    try:
        setuid = _tar({"shell": b"#!/bin/sh\nid\n"}, mode=0o4755, owner=(0, 0)).getvalue()
        for archive in (setuid, _tar({"sda": b""}, mode=0o666, kind=tarfile.CHRTYPE).getvalue()):
            with pytest.raises(docker.errors.APIError, match=DENIED):
                upload(client, mounted, "/ckpt", archive)  # seen, and refused
            with pytest.raises(docker.errors.APIError, match=DENIED):
                client.put_archive(mounted, "/ckpt", archive)  # not shown to the plugin: refused
        assert list(folder.iterdir()) == []
        upload(client, mounted, "/ckpt", _tar({"weights.bin": b"\x00" * 16}).getvalue())  # the worker's own file
        written = (folder / "weights.bin").stat()
        assert (written.st_uid, written.st_mode & 0o7777) == (os.geteuid(), 0o644)
        assert client.put_archive(bare, "/tmp", setuid)  # into the container alone: nothing of the host
    finally:
        for container in (mounted, bare):
            client.remove_container(container, force=True)
