"""Who a Docker task runs as: numbers resolved on the worker, never a name the task's own image resolves.

H2 of issue 27: ``allowed_users`` was matched as text and the engine resolved the name in the DAG author's image,
so with ``allowed_users=alice`` an image where ``alice`` is uid 0 and ``user="alice:0"`` ran as root; the group after
``:`` was never checked, and ``video``/``render`` were groups the image named. A ``group_add`` of an NVIDIA or CPU
task was dropped without a word.
"""

from __future__ import annotations

import grp
import io
import logging
import pwd
import tarfile

import pytest
from backends.docker.docker_fixtures import BASE_IMAGE, TEST_REPOSITORY

import docker
from airflow_gpu_provider import GpuStepOperator
from airflow_gpu_provider.backends.docker.backend import DockerBackend
from airflow_gpu_provider.backends.docker.files import TaskFiles
from airflow_gpu_provider.backends.docker.lifecycle import create_body
from airflow_gpu_provider.backends.docker.options import DockerOptions
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.policy import Policy, PolicyError
from airflow_gpu_provider.policy.engine import check_create
from airflow_gpu_provider.policy.paths import UnsafePathError
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.callable import shipped_callable
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.request import TaskRequest

NOBODY = pwd.getpwnam("nobody")  # on every Debian-like worker; in the image below it is root
VIDEO, RENDER = (grp.getgrnam(name).gr_gid for name in ("video", "render"))  # the worker host's device groups


def identity() -> dict:
    import os

    return {"uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups())}


@pytest.fixture(scope="module")
def root_named_image(docker_client) -> str:
    """An image whose ``/etc/passwd`` makes ``alice`` and ``nobody`` uid 0, and whose groups lack ``render``."""
    from airflow_gpu_provider.backends.docker.images.builds import builder_labels

    dockerfile = (
        f"FROM {BASE_IMAGE}\n"
        "RUN sed -i 's/^nobody:x:65534:65534:/nobody:x:0:0:/' /etc/passwd && "
        "echo 'alice:x:0:0:alice:/root:/bin/sh' >> /etc/passwd && sed -i '/^render:/d' /etc/group\n"
    )
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as archive:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        archive.addfile(info, io.BytesIO(dockerfile.encode()))
    context.seek(0)
    tag = f"{TEST_REPOSITORY}:users-root-named"
    for _ in docker_client.build(fileobj=context, custom_context=True, tag=tag, labels=builder_labels(), rm=True,
                                 forcerm=True, decode=True):  # fmt: skip
        pass
    return tag


def other_digits(number: int) -> str:
    """A number in Arabic-Indic digits: digits to Python's ``int``, a name to the engine (Go's ``strconv.Atoi``)."""
    return "".join(chr(0x660 + int(digit)) for digit in str(number))


def run_as(options: dict, image: str) -> dict:
    backend = DockerBackend(DockerOptions.parse(options), log=logging.getLogger("test.users"))
    request = TaskRequest(
        ResourceSettings(),
        ImageSettings(parent_image=image),
        Envelope.call(shipped_callable(identity, owner="test"), [], {}),
        labels={"dag_id": "users", "task_id": "t", "run_id": "r", "try_number": "1", "map_index": "-1"},
    )
    return backend.run(backend.plan(request, GpuConfig.read()), {}).return_value


def task(**backend_options) -> GpuStepOperator:
    return GpuStepOperator(task_id="t", command=["true"], backend="docker", backend_options=backend_options)


@pytest.mark.docker
@pytest.mark.usefixtures("no_leaks")
def test_h2_a_listed_name_runs_as_the_workers_numbers_never_as_the_images_root(root_named_image, monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_USERS", "nobody, alice")
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_GROUPS", "")
    task(user="nobody")  # allowed at parse: a listed user
    seen = run_as({"user": "nobody", "group_add": ["video", "render"]}, root_named_image)
    # the worker's nobody (65534:65534), not the image's (0:0); device groups by the host's gids, for a CPU task too
    assert (seen["uid"], seen["gid"]) == (NOBODY.pw_uid, NOBODY.pw_gid)
    assert {VIDEO, RENDER} <= set(seen["groups"]) and 0 not in seen["groups"]
    for user in ("alice:0", "nobody:0", "nobody:root"):  # a group the admin never listed for that user
        with pytest.raises(PolicyError, match=r"backend_options\['user'\].*allowed_users"):
            task(user=user)
        with pytest.raises(PolicyError, match="allowed_users"):  # the worker refuses it too, before any container
            run_as({"user": user}, root_named_image)


def _final_body(tmp_path, **options) -> tuple[dict, Policy]:
    """The create body the Docker backend would send (the plan, then docker-py), and the worker's policy."""
    backend = DockerBackend(DockerOptions.parse(options))
    plan = backend.plan(TaskRequest(ResourceSettings(), ImageSettings(), Envelope.run(["true"])), GpuConfig.read())
    with TaskFiles({}, parent=tmp_path / "files") as files:
        files.mounted = False  # its own mount aside, the body needs something of the host for rule D2 to bind
        body = create_body(docker.APIClient(version="1.41"), plan.create_kwargs("img"), files, plan)
    data = tmp_path / "data"
    data.mkdir()
    body["HostConfig"]["Mounts"] = [{"Type": "bind", "Source": str(data), "Target": "/d", "ReadOnly": True}]
    return body, Policy.of(GpuConfig.read())


def test_h2_the_engine_gets_numbers_only_and_the_final_check_refuses_a_name(monkeypatch, tmp_path):
    """The final check (``policy/engine.check_create``, the plugin's too) takes numbers of this host only."""
    monkeypatch.setattr("airflow_gpu_provider.policy.users.worker_ids", lambda: (50000, 50000))  # not root
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_USERS", "nobody, 1234:5678")
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_GROUPS", "nogroup")
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_MOUNT_ROOTS", f"{tmp_path}:ro")
    body, policy = _final_body(tmp_path, user="nobody", group_add=["nogroup", "video"])
    assert body["User"] == f"{NOBODY.pw_uid}:{NOBODY.pw_gid}"
    assert body["HostConfig"]["GroupAdd"] == [str(grp.getgrnam("nogroup").gr_gid), str(VIDEO)]
    check_create(body, policy)
    check_create({**body, "User": "1234:5678"}, policy)  # listed as numbers
    for user in ("nobody", "alice", "1234", "1234:0", f"{NOBODY.pw_uid}:0", "0:0", "nobody:nogroup", "",
                 f"{other_digits(NOBODY.pw_uid)}:{NOBODY.pw_gid}", f"+{NOBODY.pw_uid}:{NOBODY.pw_gid}"):  # fmt: skip
        with pytest.raises(UnsafePathError, match="User"):  # a name the image would resolve, or an unlisted pair
            check_create({**body, "User": user}, policy)
    for groups in (["video"], ["render"], ["0"], ["docker"], ["4242"], [other_digits(VIDEO)]):
        with pytest.raises(UnsafePathError, match="GroupAdd"):  # names resolve in the image; 0 is never listed
            check_create({**body, "HostConfig": {**body["HostConfig"], "GroupAdd": groups}}, policy)


def test_h2_a_user_or_group_this_host_does_not_know_is_refused_naming_the_fix(monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_USERS", "alice, 4242")
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_GROUPS", "no-such-group")
    with pytest.raises(PolicyError, match="not a user of this host"):
        task(user="alice")
    with pytest.raises(PolicyError, match="uid:gid"):
        task(user="4242")  # no passwd entry, so no group: the engine would pick the image's, or 0
    with pytest.raises(PolicyError, match="not a group of this host"):
        task(group_add=["no-such-group"])
    with pytest.raises(PolicyError, match="not a user of this host"):
        task(user="١٠٠٠")  # digits to str.isdigit, a name to the engine: a name, which this host lacks
