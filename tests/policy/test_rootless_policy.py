"""What only a rootless engine changes in the policy (``policy/rootless.py``): the engine's folders are never
mounted, whatever the allow-lists say; ``0:0`` and CDI names only for a rootless engine, in the provider's form.
"""

from __future__ import annotations

import os
import pwd
import socket

import pytest

from airflow_gpu_provider import GpuStepOperator
from airflow_gpu_provider.policy import Policy, PolicyError
from airflow_gpu_provider.policy.docker import worker_user
from airflow_gpu_provider.policy.engine import DEPLOYMENT_LABEL, check_create
from airflow_gpu_provider.policy.paths import UnsafePathError
from airflow_gpu_provider.policy.rootless import engine_folders

CDI = {"PathOnHost": "nvidia.com/gpu=0", "PathInContainer": "nvidia.com/gpu=0", "CgroupPermissions": "rwm"}


@pytest.fixture
def user_engine_socket(tmp_path, monkeypatch):
    """A local engine's socket, owned by a user other than root (the worker's own one, unless it is root)."""
    folder = tmp_path / "engine"
    folder.mkdir()
    path = folder / "engine.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    owner = pwd.getpwnam("nobody") if os.geteuid() == 0 else pwd.getpwuid(os.geteuid())
    if os.geteuid() == 0:
        os.chown(path, owner.pw_uid, owner.pw_gid)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{path}")
    yield path, owner
    server.close()


def body(**host):
    labels = {DEPLOYMENT_LABEL: Policy.current().deployment}  # as the provider labels its containers
    return {"Image": "x", "User": worker_user(), "Labels": labels, "HostConfig": {"CapDrop": ["ALL"],
            "SecurityOpt": ["no-new-privileges:true"], **host}}  # fmt: skip


def test_a_dag_authors_task_never_mounts_the_engines_socket_folder_or_its_users_home_and_runtime_dir(
    user_engine_socket, tmp_path, monkeypatch
):
    path, owner = user_engine_socket
    forbidden = [str(path.parent), owner.pw_dir, f"/run/user/{owner.pw_uid}", str(tmp_path)]  # tmp_path holds it
    if owner.pw_uid == os.geteuid():
        forbidden += [os.environ[name] for name in ("HOME", "XDG_RUNTIME_DIR") if os.environ.get(name)]
    assert set(forbidden[:3]) <= set(engine_folders(()))
    (tmp_path / "data").mkdir()
    listed = ", ".join(f"{folder}:rw" for folder in [*forbidden, str(tmp_path / "data")])
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_MOUNT_ROOTS", listed)  # whatever the allow-lists say
    for folder in forbidden:
        with pytest.raises(PolicyError, match="whose holder controls every task|part of the host no task"):
            GpuStepOperator(task_id="t", command=["true"], backend="docker",
                            backend_options={"mounts": [{"source": folder, "target": "/x", "read_only": True}]})  # fmt: skip
        mount = {"Type": "bind", "Source": folder, "Target": "/x", "ReadOnly": True}
        with pytest.raises(UnsafePathError, match="whose holder controls|part of the host"):  # the final check
            check_create(body(Mounts=[mount]), Policy.current(), rootless=True)
    GpuStepOperator(task_id="t", command=["true"], backend="docker",
                    backend_options={"mounts": [{"source": str(tmp_path / "data"), "target": "/x"}]})  # fmt: skip


def test_root_and_cdi_names_only_for_a_rootless_engine_and_only_in_the_providers_form():
    policy = Policy.current()
    check_create({**body(Devices=[CDI]), "User": "0:0"}, policy, rootless=True)  # its root is the worker
    with pytest.raises(UnsafePathError, match="Devices"):  # a rootful engine may read the name as a path
        check_create(body(Devices=[CDI]), policy)
    if os.geteuid() != 0:
        with pytest.raises(UnsafePathError, match="User"):
            check_create({**body(Devices=[CDI]), "User": "0:0"}, policy)
    variants = [
        {**CDI, "PathOnHost": "nvidia.com/gpu=../../dev/sda", "PathInContainer": "nvidia.com/gpu=../../dev/sda"},
        {**CDI, "PathInContainer": "/dev/nvidia0"},
        {**CDI, "CgroupPermissions": "rw"},
        {**CDI, "Extra": 1},
        {**CDI, "pathonhost": "/dev/sda"},
        {"PathOnHost": "/dev/sda", "PathInContainer": "/dev/sda", "CgroupPermissions": "rwm"},
    ]
    for variant in variants:
        with pytest.raises(UnsafePathError, match="Devices"):
            check_create(body(Devices=[variant]), policy, rootless=True)


def test_nvidias_stack_ulimit_goes_with_cdi_gpus_on_a_rootless_engine_only():
    """The CDI names are split off ``Devices`` before the HostConfig is judged: the ulimit still sees its GPU."""
    policy, stack = Policy.current(), [{"Name": "stack", "Soft": 67108864, "Hard": 67108864}]
    check_create({**body(Devices=[CDI], Ulimits=stack), "User": "0:0"}, policy, rootless=True)
    for host in ({"Ulimits": stack}, {"Devices": [{**CDI, "PathOnHost": "/dev/x=y"}], "Ulimits": stack}):
        with pytest.raises(UnsafePathError, match="Ulimits|Devices"):
            check_create(body(**host), policy, rootless=True)
