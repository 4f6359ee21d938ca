"""What of the worker a derived image's build may read (policy/build.py): at DAG parse, and again when building.

H3: ``find_links=["/root/.ssh"]`` and a task-level ``ca_bundle="/etc/shadow"`` used to copy root-only worker files
into the task's image. Only what lies beneath ``[gpu_policy] allowed_build_paths``, through no link, and what every local
user may read already goes in; the admin's own ``[gpu] ca_bundle`` always does.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest
from airflow.sdk import DAG, task

from airflow_gpu_provider import GpuStepOperator, ImageSettings
from airflow_gpu_provider.backends.docker.images.context import image_files
from airflow_gpu_provider.backends.docker.images.recipe import CA_PATH, SHARE
from airflow_gpu_provider.backends.docker.images.spec import BuildOptions, derived_image_spec
from airflow_gpu_provider.policy import PolicyError
from airflow_gpu_provider.policy.build import BuildPolicy, check_image_inputs

PARENT = "airflow-gpu-base:bookworm"


def needs(find_links=(), **backend_options) -> GpuStepOperator:
    """A Docker task with requirements, settled at DAG parse."""
    with DAG("build_policy", schedule=None):
        return GpuStepOperator(
            task_id="t",
            command=["true"],
            backend="docker",
            image=ImageSettings(parent_image=PARENT, requirements=["six"], find_links=list(find_links)),
            backend_options=backend_options,
        )


def test_root_only_worker_files_are_refused_at_parse_naming_the_field_and_the_option():
    with pytest.raises(PolicyError) as found:
        needs(find_links=["/root/.ssh"])
    message = str(found.value)
    assert "find_links='/root/.ssh'" in message and "[gpu_policy] allowed_build_paths" in message
    with pytest.raises(PolicyError) as found:
        needs(ca_bundle="/etc/shadow")
    message = str(found.value)
    assert "backend_options['ca_bundle']='/etc/shadow'" in message and "allowed_build_paths" in message
    with pytest.raises(PolicyError, match="find_links='file:///root/.ssh'"):
        needs(find_links=["file:///root/.ssh"])


def test_the_decorator_refuses_them_when_the_dag_is_parsed():
    with pytest.raises(PolicyError, match="find_links"):

        @task.gpu(backend="docker", image=ImageSettings(requirements=["six"], find_links=["/root/.ssh"]))
        def train() -> None:
            pass


def test_beneath_an_allowed_path_only_what_everyone_may_read_and_no_link(build_inputs):
    wheels = build_inputs / "wheels"
    wheels.mkdir()
    (wheels / "six-1.16.0-py2.py3-none-any.whl").write_bytes(b"wheel")
    needs(find_links=[str(wheels)])  # allowed
    needs(find_links=[f"file://{wheels}"])
    needs(find_links=["https://wheels.example.com/"])  # a URL reads nothing of the worker
    needs(find_links=[str(build_inputs / "not-here-but-on-the-worker")])  # checked there

    secret = build_inputs / "secret.pem"
    secret.write_text("key")
    secret.chmod(0o600)
    with pytest.raises(PolicyError, match="mode 0600.*secret"):
        needs(ca_bundle=str(secret))
    (wheels / "token.whl").write_bytes(b"x")
    (wheels / "token.whl").chmod(0o640)
    with pytest.raises(PolicyError, match="token.whl is readable by its owner or group only"):
        needs(find_links=[str(wheels)])
    (wheels / "token.whl").unlink()

    private = build_inputs / "private"
    (private / "wheels").mkdir(parents=True)
    private.chmod(0o700)
    with pytest.raises(PolicyError, match="private is closed to other users"):
        needs(find_links=[str(private / "wheels")])

    (build_inputs / "ssh").symlink_to("/root")
    with pytest.raises(PolicyError, match="symbolic link"):
        needs(find_links=[str(build_inputs / "ssh")])
    with pytest.raises(PolicyError, match="'.' or '..'"):
        needs(find_links=[f"{build_inputs}/../../etc"])


def test_the_admins_ca_bundle_is_always_allowed(monkeypatch):
    """The removed ``[gpu] ca_bundle`` still works for one release (warning, naming the connection field)."""
    from airflow.exceptions import AirflowProviderDeprecationWarning

    monkeypatch.setenv("AIRFLOW__GPU__CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    with pytest.warns(AirflowProviderDeprecationWarning, match="set the Docker connection's extra ca_bundle"):
        needs(ca_bundle="/etc/ssl/certs/ca-certificates.crt")
        policy = BuildPolicy.current()
    assert policy.ca_bundle == "/etc/ssl/certs/ca-certificates.crt"
    check_image_inputs(ImageSettings(requirements=["six"]), "/etc/ssl/certs/ca-certificates.crt", policy)


def test_a_task_without_requirements_builds_nothing_and_reads_nothing():
    with DAG("build_policy_plain", schedule=None):
        GpuStepOperator(task_id="t", command=["true"], backend="docker", backend_options={"ca_bundle": "/etc/shadow"})


def test_the_worker_checks_again_before_it_reads_or_copies(build_inputs):
    """The DAG processor's files and configuration are not the worker's: the build checks with its own."""
    with pytest.raises(PolicyError, match="ca_bundle"):
        derived_image_spec(
            PARENT, ImageSettings(requirements=["six"]), BuildOptions(ca_bundle="/etc/shadow"), uv_binary=None
        )
    with pytest.raises(PolicyError, match="find_links"):
        derived_image_spec(
            PARENT, ImageSettings(requirements=["six"], find_links=["/root"]), BuildOptions(), uv_binary=None
        )
    elsewhere = BuildPolicy(("/opt/wheels",), None)  # the worker allows less than the DAG processor did
    with pytest.raises(PolicyError, match="allowed_build_paths lists: /opt/wheels"):
        derived_image_spec(
            PARENT, ImageSettings(requirements=["six"], find_links=[str(build_inputs)]), BuildOptions(policy=elsewhere),
            uv_binary=None,
        )  # fmt: skip

    bundle = build_inputs / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    bundle.chmod(0o644)
    spec = derived_image_spec(
        PARENT, ImageSettings(requirements=["six"]), BuildOptions(ca_bundle=str(bundle)), uv_binary=None
    )
    bundle.chmod(0o600)  # made a secret after the spec was made: the copy refuses it
    with pytest.raises(PolicyError, match="mode 0600"):
        image_files(spec)
    bundle.chmod(0o644)
    with image_files(spec) as context, tarfile.open(fileobj=context) as tar:
        member = tar.getmember(CA_PATH.lstrip("/"))
        assert tar.extractfile(member).read() == b"-----BEGIN CERTIFICATE-----\n" and member.uid == 0


def test_a_wheel_folder_is_copied_flat_its_regular_files_only(build_inputs):
    wheels = build_inputs / "wheels"
    (wheels / "nested").mkdir(parents=True)
    (wheels / "a-1.0-py3-none-any.whl").write_bytes(b"a")
    (wheels / "nested" / "b-1.0-py3-none-any.whl").write_bytes(b"b")
    (wheels / "shadow").symlink_to("/etc/shadow")
    spec = derived_image_spec(
        PARENT, ImageSettings(requirements=["a"], find_links=[str(wheels)]), BuildOptions(), uv_binary=None
    )
    share = SHARE.lstrip("/")
    with image_files(spec) as context, tarfile.open(fileobj=context) as tar:
        names = [share, f"{share}/find-links-0", f"{share}/find-links-0/a-1.0-py3-none-any.whl"]
        assert sorted(tar.getnames()) == names
    assert os.path.islink(wheels / "shadow") and Path("/etc/shadow").exists()
