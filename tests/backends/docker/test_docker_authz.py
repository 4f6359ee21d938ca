"""The engine enforces the policy, whoever calls it: a second engine with the provider's authorization plugin.

Every API call goes through ``airflow-gpu-docker-authz`` (``authz_engine.py``), run as installed. Each finding of
issues 27 and 34 is tried against it the way it ran, and checked by its effect on the engine and the host: what was
created, started, written. The provider's own Docker tasks run on this engine in their own tests (``docker_engine``:
plain, deferred, derived image, checkpoint, OOM). The differential test sends mutated requests over a raw socket and
checks that nothing the policy forbids happened, whatever the plugin thought.
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import tarfile
import time
from pathlib import Path

import pytest
from backends.docker.authz_engine import VOLUMES
from backends.docker.docker_fixtures import BASE_IMAGE
from helpers import start_worker, worker_result

import docker
from airflow_gpu_provider.host.workers import deployment
from airflow_gpu_provider.policy.authz.stored import DEPLOYMENT_LABEL
from airflow_gpu_provider.policy.docker import worker_user

pytestmark = pytest.mark.docker
DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "docker_escape_dags.py"
DENIED = "authorization denied by plugin airflow-gpu"
OWN = worker_user()
LABELS = {DEPLOYMENT_LABEL: deployment()}


def safe_host(client, **extra):
    return client.create_host_config(cap_drop=["ALL"], security_opt=["no-new-privileges:true"], **extra)


def send(engine, request: bytes) -> tuple[int, bytes]:
    """A raw request on the engine's socket: its status and body."""
    with socket.socket(socket.AF_UNIX) as connection:
        connection.settimeout(60)
        connection.connect(str(engine.root / "docker.sock"))
        connection.sendall(request)
        response = b""
        while chunk := connection.recv(65536):
            response += chunk
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def http(method: str, uri: str, body: bytes = b"", headers: tuple[str, ...] = ()) -> bytes:
    lines = [f"{method} {uri} HTTP/1.1", "Host: docker", "Connection: close", *headers]
    if body or method in ("POST", "PUT"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def test_h1_a_dag_files_own_docker_call_is_refused_by_the_engine(authz_engine, airflow_home):
    """Issue 27: the module level of a DAG file asks for the host's / and PID namespace: the engine refuses; the
    DAG's ordinary Docker GPU task runs on the same engine, through the same plugin."""
    before = {c["Id"] for c in authz_engine.client.containers(all=True)}
    env = {"DOCKER_HOST": authz_engine.url, "AIRFLOW_GPU_TEST_ESCAPE": authz_engine.url}
    worker = start_worker(DAG_FILE, "docker_escape", env=env)
    log, _ = worker.communicate(timeout=240)
    result = worker_result(log)
    assert result.get("states") == {"ordinary": "success"}, log[-5000:]
    escape = result["xcom"]["ordinary"]["escape"]
    assert escape.startswith("refused:") and DENIED in escape, escape
    assert {c["Id"] for c in authz_engine.client.containers(all=True)} == before  # nothing created, nothing left


def test_issue34_h1_no_upload_into_a_container_that_may_write_to_a_host_folder(authz_engine, tmp_path):
    """An upload that Python's tarfile reads as two plain files of the worker's is, for the engine's Go reader, a
    setuid-root shell (a size field with leading NULs): refused whatever it holds, into any container that may write
    to a host folder or volume; into one without, it lands in the container alone."""
    client = authz_engine.client
    folder = tmp_path / "checkpoint"  # beneath a checkpoint root of the plugin's (pytest's temporary root)
    folder.mkdir()
    mounted = client.create_container(BASE_IMAGE, ["true"], user=OWN, labels=LABELS, host_config=safe_host(
        client, mounts=[docker.types.Mount("/ckpt", str(folder), type="bind")]))["Id"]  # fmt: skip
    bare = client.create_container(BASE_IMAGE, ["true"], user=OWN, labels=LABELS, host_config=safe_host(client))["Id"]
    try:
        for archive in (_two_readers_tar(), _tar(kind=tarfile.CHRTYPE), _tar(mode=0o4755, owner=(0, 0)), _tar()):
            with pytest.raises(docker.errors.APIError, match=f"{DENIED}.*unpacks it as root"):
                client.put_archive(mounted, "/", archive)  # (the provider's form: into "/")
        assert list(folder.iterdir()) == []
        assert client.put_archive(bare, "/", _two_readers_tar())
    finally:
        for container in (mounted, bare):
            client.remove_container(container, force=True)


def _tar(*, mode: int = 0o644, owner: tuple[int, int] | None = None, kind: bytes = tarfile.REGTYPE) -> bytes:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as archive:
        info = tarfile.TarInfo("ckpt/file")
        info.mode, info.type, (info.uid, info.gid) = mode, kind, owner or (os.geteuid(), os.getegid())
        info.size = 4 if kind == tarfile.REGTYPE else 0
        archive.addfile(info, io.BytesIO(b"data") if kind == tarfile.REGTYPE else None)
    return data.getvalue()


def _two_readers_tar() -> bytes:
    """H1's archive: its size field starts with NULs, which Python reads as 0 and Go skips to read 512."""
    header = bytearray(_tar(mode=0o4755, owner=(0, 0))[:512])
    header[124:136] = b"\x00" * 7 + b"1000\x00"  # the size: "" for Python, octal 1000 (512) for Go
    header[148:156] = b" " * 8
    header[148:156] = f"{sum(header):06o}\0 ".encode()
    return bytes(header) + b"#!/bin/sh\nid\n".ljust(512, b"\0") + b"\0" * 1024


CONTAINER = "c" * 64


def images(engine) -> set[str]:
    """The engine's tags, as it keeps them on disk (the plugin lets no one list them by name)."""
    kept = json.loads((engine.root / "data" / "image" / "overlay2" / "repositories.json").read_text())["Repositories"]
    return {tag for tags in kept.values() for tag in tags}


def running(engine, container: str) -> bool:
    """Whether the engine's record of ``container`` says it runs (its inspect may be refused)."""
    return json.loads((engine.root / "data" / "containers" / container / "config.v2.json").read_text())["State"][
        "Running"
    ]


@pytest.mark.parametrize(
    ("uri", "json_body"),
    [
        ("/v1.41/build?networkmode=default&t=agpu-authz-h2", False),
        ("/v1.41/commit?container={id}&repo=agpu-authz-h2&tag=0123456789abcdef&pause=True", True),
        ("/v1.41/images/create?fromImage=airflow-gpu-base&tag=bookworm", False),
        ("/v1.41/containers/{id}/start", False),
    ],
)
def test_issue34_h2_a_second_content_type_hides_no_form_whatever_their_order(authz_engine, uri, json_body):
    """The engine shows the plugin a body by the FIRST Content-Type, hands it the LAST of each header, and reads a form
    by the FIRST: form values override the query (a build judged as networkmode=default ran on the host's network).
    Both orders, and a form alone, are refused, and nothing happens."""
    client = authz_engine.client
    created = client.create_container(BASE_IMAGE, ["sleep", "60"], user=OWN, labels=LABELS,
                                      host_config=safe_host(client))["Id"]  # fmt: skip
    form = b"networkmode=host&t=agpu-authz-h2&repo=agpu-authz-h2&tag=0123456789abcdef&fromImage=busybox"
    try:
        for types in (("application/x-www-form-urlencoded", "application/json"),
                      ("application/json", "application/x-www-form-urlencoded"),
                      ("application/x-www-form-urlencoded",)):  # fmt: skip
            headers = tuple(f"Content-Type: {kind}" for kind in types)
            status, answer = send(authz_engine, http("POST", uri.format(id=created), form, headers))
            assert status == 403 and DENIED.encode() in answer, (types, status, answer)
        assert not any(tag.startswith("agpu-authz-h2") for tag in images(authz_engine))
        assert not running(authz_engine, created)
    finally:
        client.remove_container(created, force=True)


def test_issue34_m1_m2_a_container_made_before_the_plugin_is_reached_only_as_a_create_could_make_it(authz_engine):
    """M1: a privileged root container with a host folder, labelled as this deployment's, made before the plugin:
    no start, attach, copy in or out, commit, exec. M2: a container of no one's: no stop, kill, removal, logs.
    Nor a volume, an image or a network of no one's, nor a prune."""
    client, planted = authz_engine.client, authz_engine.planted
    ours, foreign = planted["ours"], planted["foreign"]
    refused = {
        "start": lambda: client.start(ours), "attach": lambda: client.attach(ours, stream=False, logs=True),
        "copy in": lambda: client.put_archive(ours, "/host", _tar(mode=0o4755, owner=(0, 0))),
        "copy out": lambda: client.get_archive(ours, "/etc/hostname"),
        "commit": lambda: client.commit(ours, "agpu-authz-m1", "0123456789abcdef", conf={"Labels": LABELS}),
        "exec": lambda: client.exec_create(ours, ["id"]), "stop": lambda: client.stop(foreign, timeout=1),
        "kill": lambda: client.kill(foreign), "remove": lambda: client.remove_container(foreign, force=True),
        "logs": lambda: client.logs(foreign), "rename": lambda: client.rename(foreign, "x"),
        "prune": client.prune_containers, "remove a volume": lambda: client.remove_volume(VOLUMES["plain"]),
        "remove an image": lambda: client.remove_image(BASE_IMAGE),
        "remove a network": lambda: client.remove_network("none"),
    }  # fmt: skip
    for name, call in refused.items():
        with pytest.raises(docker.errors.APIError, match=DENIED):
            call()
            pytest.fail(f"{name} was allowed")
    assert not running(authz_engine, ours)  # as the engine keeps it: their inspects are refused too
    assert (authz_engine.root / "data" / "containers" / foreign).is_dir()  # not removed
    assert list(Path(planted["folder"]).iterdir()) == []
    assert BASE_IMAGE in images(authz_engine) and not any(
        tag.startswith("agpu-authz-m1") for tag in images(authz_engine)
    )


def test_issue34_m3_a_listed_volume_gets_no_copy_up_and_a_bind_in_disguise_is_refused(authz_engine, tmp_path):
    """M3: a listed volume that is a host folder (driver options) was filled from the task's image on first mount,
    setuid files included. Such a volume is refused; a plain one is mounted without copy-up."""
    client = authz_engine.client
    mount = {"Target": "/etc/ssl", "Type": "volume", "ReadOnly": False, "VolumeOptions": {"NoCopy": True}}
    for name, allowed in ((VOLUMES["bind"], False), (VOLUMES["plain"], True)):
        host = safe_host(client, mounts=[{**mount, "Source": name}])
        if not allowed:
            with pytest.raises(docker.errors.APIError, match=f"{DENIED}.*only plain local volumes"):
                client.create_container(BASE_IMAGE, ["true"], user=OWN, labels=LABELS, host_config=host)
            continue
        created = client.create_container(BASE_IMAGE, ["true"], user=OWN, labels=LABELS, host_config=host)["Id"]
        try:
            client.start(created)
            client.wait(created)
        finally:
            client.remove_container(created, force=True)
    data = authz_engine.root / "data" / "volumes" / VOLUMES["plain"] / "_data"
    assert list(data.iterdir()) == [] and list(Path(authz_engine.planted["volume-host"]).iterdir()) == []
    copied = safe_host(client, mounts=[{**mount, "Source": VOLUMES["plain"], "VolumeOptions": {"NoCopy": False}}])
    with pytest.raises(docker.errors.APIError, match=f"{DENIED}.*without copy-up"):
        client.create_container(BASE_IMAGE, ["true"], user=OWN, labels=LABELS, host_config=copied)


def test_issue34_low_rtprio_and_memlock_are_no_harmless_ulimits(authz_engine):
    client = authz_engine.client
    for ulimits in ([docker.types.Ulimit(name="rtprio", soft=99, hard=99)],
                    [docker.types.Ulimit(name="memlock", soft=-1, hard=-1)]):  # fmt: skip
        with pytest.raises(docker.errors.APIError, match=f"{DENIED}.*Ulimits"):
            client.create_container(BASE_IMAGE, ["true"], user=OWN, labels=LABELS,
                                    host_config=safe_host(client, ulimits=ulimits))  # fmt: skip


def test_issue34_low_a_stopped_judge_is_a_refusal_not_a_hang(authz_engine):
    """The judge runs as the workers' user, who may stop it: the engine gets a refusal within the plugin's timeout."""
    judge = int([line for line in (authz_engine.root / "plugin.log").read_text().splitlines()
                 if " judges as uid " in line][-1].split("judge ", 1)[1].split()[0])  # the latest  # fmt: skip
    os.kill(judge, signal.SIGSTOP)
    started = time.monotonic()
    with pytest.raises(docker.errors.APIError, match=f"{DENIED}.*no verdict in time"):
        authz_engine.client.containers(all=True, filters={"label": "airflow-gpu-provider.worker"})
    assert time.monotonic() - started < 30
    assert authz_engine.client.containers(all=True, filters={"label": "airflow-gpu-provider.worker"}) is not None


def test_what_no_public_plugin_checks_the_effect_of_mutated_requests(authz_engine):
    """The differential test: the provider's create call, mutated as a reader could disagree (field case, Go's
    folding, a field twice, HostConfig's fields at the top, API versions, query forms, Content-Types in both orders,
    no Content-Type), each asking for the host, sent over a raw socket. Whatever the plugin answers, no container the
    engine made has anything of the host; refused ones made nothing."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    client = authz_engine.client
    base = {"Image": BASE_IMAGE, "Cmd": ["true"], "User": OWN, "Labels": LABELS,
            "HostConfig": {"CapDrop": ["ALL"], "SecurityOpt": ["no-new-privileges:true"]}}  # fmt: skip
    outcomes = {"made": 0, "refused": 0}
    asks = {
        "Privileged": ("HostConfig", "Privileged", True), "PidMode": ("HostConfig", "PidMode", "host"),
        "Binds": ("HostConfig", "Binds", ["/:/host"]), "CapAdd": ("HostConfig", "CapAdd", ["SYS_ADMIN"]),
        "User": ("", "User", "4242:4242"), "CapDrop": ("HostConfig", "CapDrop", []), "nothing": ("", "", None),
    }  # fmt: skip

    def body(ask: str, spelling: str, where: str, twice: bool) -> bytes:
        section, field, value = asks[ask]
        if not field:
            return json.dumps(base).encode()
        name = {"exact": field, "lower": field.lower(), "folded": field.replace("s", "ſ").replace("k", "K")}[spelling]
        text = json.dumps(base)
        member = f"{json.dumps(name)}: {json.dumps(value)}"
        if section == "" or where == "top":
            return (text[:-1] + f", {member}}}").encode()
        host = json.dumps(base["HostConfig"])
        inner = host[:-1] + f", {member}}}"
        if twice:  # HostConfig twice: Go merges the two objects
            return (text[:-1] + f', "HostConfig": {inner}}}').encode()
        return text.replace(f'"HostConfig": {host}', f'"HostConfig": {inner}').encode()

    @settings(max_examples=60, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(
        ask=st.sampled_from(sorted(asks)), spelling=st.sampled_from(["exact", "lower", "folded"]),
        where=st.sampled_from(["hostconfig", "top"]), twice=st.booleans(),
        version=st.sampled_from(["/v1.41", "/v1.41", "/v1.40", "/v1.24", ""]),
        query=st.sampled_from(["", "?name=agpu-authz-x", "?;name=x"]),
        types=st.sampled_from([("application/json",), (), ("text/plain",), ("application/json; charset=utf-8",),
                               ("application/x-www-form-urlencoded", "application/json"),
                               ("application/json", "application/x-www-form-urlencoded")]),
    )  # fmt: skip
    def case(ask, spelling, where, twice, version, query, types):
        before = {c["Id"] for c in client.containers(all=True)}
        headers = tuple(f"Content-Type: {kind}" for kind in types)
        status, answer = send(authz_engine, http("POST", f"{version}/containers/create{query}",
                                                 body(ask, spelling, where, twice), headers))  # fmt: skip
        made = {c["Id"] for c in client.containers(all=True)} - before
        if status >= 300:
            outcomes["refused"] += 1
            assert not made, (status, answer)
            return
        outcomes["made"] += 1
        for container in made:
            found = client.inspect_container(container)
            client.remove_container(container, force=True)
            host = found["HostConfig"]
            assert not host["Privileged"] and host["PidMode"] == "" and not host["Binds"], host
            assert host["CapDrop"] == ["ALL"] and not host["CapAdd"] and found["Config"]["User"] == OWN, found

    case()
    assert outcomes["made"] > 0 and outcomes["refused"] > 0, outcomes


def test_a_client_other_than_the_provider_gets_the_providers_answers_in_the_providers_form(authz_engine, tmp_path):
    """The provider's own create, sent by docker-py: allowed; a body the policy refuses: refused in the provider's own
    check's words; the docker CLI's own form of a harmless container: refused (not the provider's form)."""
    import subprocess

    from airflow_gpu_provider.policy.engine import check_create
    from airflow_gpu_provider.policy.paths import UnsafePathError

    client, policy = authz_engine.client, authz_engine.policy
    body = {"Image": BASE_IMAGE, "Cmd": ["true"], "User": OWN, "Labels": LABELS,
            "HostConfig": {"CapDrop": ["ALL"], "SecurityOpt": ["no-new-privileges:true"]}}  # fmt: skip
    folder = {"Mounts": [{"Type": "bind", "Source": str(tmp_path), "Target": "/t", "ReadOnly": True}]}
    for name, changed in {
        "the provider's": body, "privileged": {**body, "HostConfig": {**body["HostConfig"], "Privileged": True}},
        "root with a host folder": {**body, "User": "0:0", "HostConfig": {**body["HostConfig"], **folder}},
        "a name the image resolves": {**body, "User": "root:0", "HostConfig": {**body["HostConfig"], **folder}},
        "another deployment's": {**body, "Labels": {DEPLOYMENT_LABEL: "staging"}},
    }.items():  # fmt: skip
        try:
            check_create(changed, policy)
            expected = ""
        except UnsafePathError as err:
            expected = str(err)
        try:
            client.remove_container(client.create_container_from_config(changed)["Id"], force=True)
            answer = ""
        except docker.errors.APIError as err:
            assert err.status_code == 403 and DENIED in str(err.explanation), (name, err)
            answer = str(err.explanation).split("POST /v1.41/containers/create: ", 1)[1]
        assert answer == expected, (name, answer, expected)
    done = subprocess.run(["docker", "-H", authz_engine.url, "run", "--rm", "--user", OWN, "--cap-drop", "ALL",
                           "--security-opt", "no-new-privileges", BASE_IMAGE, "true"],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode != 0 and DENIED in done.stderr, done.stderr
