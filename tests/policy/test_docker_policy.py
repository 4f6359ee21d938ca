"""What a Docker task may get of the host: refused at parse beyond the allow-lists, and on the final create call.

H2 (capabilities, users, groups, namespaces), H5 (a mount redirected between check and mount), M2 (the short mount
deny-list) each fail on the code before the policy layer.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from backends.docker.docker_fixtures import BASE_IMAGE

import docker
from airflow_gpu_provider import GpuStepOperator
from airflow_gpu_provider.backends import BACKENDS
from airflow_gpu_provider.backends.docker.files import TaskFiles
from airflow_gpu_provider.backends.docker.lifecycle import create_body
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.policy import Policy, PolicyError
from airflow_gpu_provider.policy.docker import worker_user
from airflow_gpu_provider.policy.engine import check_create
from airflow_gpu_provider.policy.paths import UnsafePathError
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.request import TaskRequest


def task(**backend_options):
    return GpuStepOperator(task_id="t", command=["true"], backend="docker", backend_options=backend_options)


@pytest.mark.parametrize(
    ("options", "field", "option"),
    [
        ({"cap_add": ["DAC_READ_SEARCH"]}, "cap_add", "allowed_capabilities"),  # H2: open_by_handle_at
        ({"cap_add": ["ALL"]}, "cap_add", "allowed_capabilities"),
        ({"user": "0"}, "user", "allowed_users"),
        ({"user": 0}, "user", "allowed_users"),
        ({"user": "root"}, "user", "allowed_users"),
        ({"group_add": ["0"]}, "group_add", "allowed_groups"),
        ({"group_add": ["docker"]}, "group_add", "allowed_groups"),
        ({"network_mode": "container:abc123"}, "network_mode", "allowed_network_modes"),
        ({"network_mode": "host"}, "network_mode", "allowed_network_modes"),
        ({"ipc_mode": "container:abc123"}, "ipc_mode", "allowed_ipc_modes"),
        ({"ipc_mode": "host"}, "ipc_mode", "allowed_ipc_modes"),
        ({"mounts": [{"source": "/data", "target": "/d"}]}, "mounts", "allowed_mount_roots"),
        ({"mounts": [{"source": "hf-cache", "target": "/c", "type": "volume"}]}, "mounts", "allowed_volumes"),
    ],
)
def test_h2_more_of_the_host_than_the_deployment_allows_is_refused_at_parse(options, field, option, monkeypatch):
    monkeypatch.setattr("airflow_gpu_provider.policy.users.worker_ids", lambda: (50000, 0))  # a worker not root
    with pytest.raises(PolicyError, match=rf"backend_options\['{field}'\].*\[gpu_policy\] {option} lists") as refused:
        task(**options)
    assert refused.value.option == option


def test_what_the_admin_lists_is_allowed_but_all_capabilities_never(monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_CAPABILITIES", "SYS_PTRACE, ALL")
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_USERS", "1000:1000")
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_GROUPS", "4321")
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_NETWORK_MODES", "bridge,ml-net")
    task(cap_add=["SYS_PTRACE"], user="1000:1000", group_add=["4321"], network_mode="ml-net", ipc_mode="private")
    with pytest.raises(PolicyError, match="cap_add"):
        task(cap_add=["ALL"])  # rule: nothing privileged, even when listed
    task(user=worker_user())  # the worker's own user needs no listing


@pytest.mark.parametrize(
    ("roots", "mount", "fragment"),
    [
        ("/etc:ro", {"source": "/etc", "target": "/e", "read_only": True}, "no task may see"),  # M2: shadow, keys
        ("/var/run:ro", {"source": "/var/run", "target": "/r", "read_only": True}, "no task may see"),  # a socket
        ("/var/lib/docker:ro", {"source": "/var/lib/docker", "target": "/d", "read_only": True}, "runtime"),
        ("/var/spool:ro", {"source": "/var/spool", "target": "/s"}, "read-only only"),  # M2: /var/spool rw
        ("/data:ro", {"source": "/data/../etc", "target": "/s", "read_only": True}, r"'\.' or '\.\.'"),
        ("/data:rw", {"source": "/data/models", "target": "/m", "read_only": True}, "beneath /data, which tasks"),
        ("/data:ro", {"source": "/srv", "target": "/m", "read_only": True}, "beneath none of the roots"),
    ],
)
def test_m2_h5_mounts_outside_the_allowed_roots_are_refused(monkeypatch, roots, mount, fragment):
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_MOUNT_ROOTS", roots)
    with pytest.raises(PolicyError, match=fragment):
        task(mounts=[mount])


def test_the_state_dir_and_checkpoint_roots_are_never_mountable(monkeypatch, state_dir):
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_MOUNT_ROOTS", f"{state_dir.parent}:rw")
    with pytest.raises(PolicyError, match="which tasks write to"):
        task(mounts=[{"source": str(state_dir.parent), "target": "/x"}])


def _create_call(policy_env, monkeypatch, tmp_path, **options):
    """The create call's body the Docker backend would send (the plan, then docker-py), and the worker's policy."""
    for name, value in policy_env.items():
        monkeypatch.setenv(f"AIRFLOW__GPU__{name.upper()}", value)
    backend = BACKENDS["docker"].create(options, logging.getLogger("t"))
    plan = backend.plan(TaskRequest(ResourceSettings(), ImageSettings(), Envelope.run(["true"])), GpuConfig.read())
    with TaskFiles({}, parent=tmp_path / "files") as files:
        files.mounted = False  # the files' own mount is the provider's: these tests judge the task's
        body = create_body(docker.APIClient(version="1.41"), plan.create_kwargs("img"), files, plan)
    return body, plan.policy


def test_the_final_create_call_meets_the_policy(monkeypatch, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    body, policy = _create_call({"allowed_mount_roots": f"{tmp_path}:ro"}, monkeypatch, tmp_path,
                                mounts=[{"source": str(data), "target": "/d", "read_only": True}])  # fmt: skip
    check_create(body, policy)
    assert body["User"] == worker_user() and body["HostConfig"]["CapDrop"] == ["ALL"]
    tampered = [
        ("Privileged", True), ("CapAdd", ["SYS_ADMIN"]), ("CapDrop", []), ("PidMode", "host"),
        ("SecurityOpt", ["seccomp=unconfined", "no-new-privileges:true"]), ("SecurityOpt", []),
        ("NetworkMode", "container:x"), ("Devices", [{"PathOnHost": "/dev/sda", "PathInContainer": "/dev/sda"}]),
        ("GroupAdd", ["0"]), ("Binds", ["/:/host"]), ("Sysctls", {"kernel.msgmax": "1"}), ("UsernsMode", "host"),
        ("MaskedPaths", []), ("CgroupParent", "/"), ("DeviceCgroupRules", ["b *:* rwm"]), ("Runtime", "runsc"),
        ("LogConfig", {"Type": "syslog", "Config": {}}), ("PortBindings", {"80/tcp": [{"HostPort": "80"}]}),
        ("OomScoreAdj", -1000), ("Cgroup", "container:x"), ("VolumeDriver", "x"), ("Unknown", "set"),
    ]  # fmt: skip
    for key, value in tampered:
        with pytest.raises(UnsafePathError, match=f"(?i){key}"):
            check_create({**body, "HostConfig": {**body["HostConfig"], key: value}}, policy)
    with pytest.raises(UnsafePathError, match="User"):
        check_create({**body, "User": "0:0"} if os.geteuid() else {**body, "User": "1:1"}, policy)
    for variant in ({"Privileged": True}, {"PidMode": "host"}):  # no HostConfig: the engine takes these at the top
        with pytest.raises(UnsafePathError, match="(?i)privileged|pidmode"):
            check_create({**body, **variant}, policy)
    twice = {**body, "HostConfig": {**body["HostConfig"], "privileged": False, "PRIVILEGED": True}}
    with pytest.raises(UnsafePathError, match="named twice"):  # the engine matches names whatever their case
        check_create(twice, policy)
    with pytest.raises(UnsafePathError, match="(?i)securityopt"):  # Go folds 'ſ' to 's' too
        check_create({**body, "HostConfig": {**body["HostConfig"], "ſecurityOpt": ["seccomp=unconfined"]}}, policy)


def test_h5_a_mount_source_swapped_for_a_link_is_refused_before_the_container_exists(monkeypatch, tmp_path):
    """H5: the guard checked the path, then Docker resolved the string again; a flipped component gave /etc rw."""
    share = tmp_path / "share"
    (share / "data").mkdir(parents=True)
    body, policy = _create_call(
        {"allowed_mount_roots": f"{share}:ro"},
        monkeypatch,
        tmp_path,
        mounts=[{"source": str(share / "data"), "target": "/d", "read_only": True}],
    )
    (share / "data").rmdir()
    (share / "data").symlink_to("/etc")  # the flip, after the plan and before the create call
    with pytest.raises(UnsafePathError, match="symbolic link"):
        check_create(body, policy)


def test_a_source_in_a_folder_another_user_owns_is_refused(monkeypatch, tmp_path):
    theirs = tmp_path / "theirs"
    (theirs / "data").mkdir(parents=True)
    body, policy = _create_call(
        {"allowed_mount_roots": f"{theirs}:ro"},
        monkeypatch,
        tmp_path,
        mounts=[{"source": str(theirs / "data"), "target": "/d", "read_only": True}],
    )
    os.chown(theirs, 1000, 1000)
    with pytest.raises(UnsafePathError, match="belongs to uid 1000"):
        check_create(body, policy)


@pytest.mark.docker
def test_the_backend_refuses_a_flipped_mount_and_creates_nothing(monkeypatch, tmp_path, docker_client):
    share = tmp_path / "share"
    (share / "data").mkdir(parents=True)
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_MOUNT_ROOTS", f"{share}:ro")
    mounts = [{"source": str(share / "data"), "target": "/d", "read_only": True}]
    backend = BACKENDS["docker"].create({"mounts": mounts}, None)
    request = TaskRequest(ResourceSettings(), ImageSettings(parent_image=BASE_IMAGE), Envelope.run(["true"]))
    plan = backend.plan(request, GpuConfig.read())
    (share / "data").rmdir()
    (share / "data").symlink_to("/")
    before = {c["Id"] for c in docker_client.containers(all=True)}
    with pytest.raises(UnsafePathError, match="symbolic link"):
        backend.run(plan, {})
    assert {c["Id"] for c in docker_client.containers(all=True)} == before
    assert not Path(share / "data").is_dir() or Path(share / "data").is_symlink()


def test_the_most_specific_mount_root_decides_and_no_path_is_listed_both_ways(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_MOUNT_ROOTS", f"{tmp_path}:ro, {tmp_path}/scratch:rw")
    task(mounts=[{"source": f"{tmp_path}/scratch", "target": "/s"}])  # read-write: its own root says so
    with pytest.raises(PolicyError, match="read-only only"):
        task(mounts=[{"source": f"{tmp_path}/data", "target": "/d"}])
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_MOUNT_ROOTS", f"{tmp_path}:ro, {tmp_path}/:rw")
    with pytest.raises(ValueError, match="listed both read-only and read-write"):
        Policy.current()


def test_a_bind_source_reaches_the_engine_in_the_form_that_was_checked(monkeypatch, tmp_path):
    (tmp_path / "data").mkdir()
    body, _ = _create_call({"allowed_mount_roots": f"{tmp_path}:ro"}, monkeypatch, tmp_path,
                           mounts=[{"source": f"/{tmp_path}/data/", "target": "/d", "read_only": True}])  # fmt: skip
    assert [m["Source"] for m in body["HostConfig"]["Mounts"]] == [f"{tmp_path}/data"]


def test_a_shares_create_call_meets_the_policy_and_the_plugins_form(monkeypatch, tmp_path):
    """A share of a GPU adds nothing to the container (PyTorch's cap rides in the envelope; no MPS pipe or host IPC):
    its create call is a one-GPU call on the device the allocator gave, passed by the plugin's check and its form."""
    import json

    from airflow_gpu_provider.policy.authz.calls import match

    backend = BACKENDS["docker"].create({}, logging.getLogger("t"))
    bodies = []
    for resources in (
        ResourceSettings(gpu_count=0.5),
        ResourceSettings(gpu_share="1GiB"),
        ResourceSettings(gpu_count=1),
    ):
        plan = backend.plan(TaskRequest(resources, ImageSettings(), Envelope.run(["true"])), GpuConfig.read())
        with TaskFiles({}, parent=tmp_path / "files") as files:
            files.mounted = False
            body = create_body(
                docker.APIClient(version="1.41"), plan.on_devices(["0"]).create_kwargs("img"), files, plan
            )
        check_create(body, plan.policy)
        sent = json.dumps({k: v for k, v in body.items() if v is not None}).encode()  # as docker-py posts it
        headers = {"Content-Type": "application/json", "Content-Length": str(len(sent))}
        request = {"RequestMethod": "POST", "RequestUri": "/v1.41/containers/create", "RequestHeaders": headers}
        assert match(request, sent).form.what == "create a container"
        bodies.append(body)
    assert bodies[0]["HostConfig"]["DeviceRequests"] == bodies[2]["HostConfig"]["DeviceRequests"]
    assert bodies[0]["HostConfig"]["DeviceRequests"][0]["DeviceIDs"] == ["0"]
    assert bodies[0]["HostConfig"].get("IpcMode") == bodies[2]["HostConfig"].get("IpcMode")
    assert not [v for body in bodies[:2] for v in body.get("Env") or [] if v.startswith("CUDA_MPS")]
