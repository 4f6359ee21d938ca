"""The rendered pod's containers, run in Docker: the init container installs requirements with uv into the shared
directory, the main container runs the shipped runtime, and the result lands where the XCom sidecar reads it.

Kubernetes itself is not involved (none can be had here): see pod_in_docker.py for what this does and does not show.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from backends.docker.docker_fixtures import BASE_IMAGE
from pod_in_docker import leftover_containers, run_pod

from airflow_gpu_provider.exceptions import InvalidSettingError, RemoteTaskError
from airflow_gpu_provider.task.result import result_value

pytestmark = pytest.mark.docker  # the Docker guard: an engine and the base image (built when missing), or skip


def uses_a_requirement(n: int) -> dict:
    import six

    return {"square": n * n, "six": six.__version__}


def raises_inside_the_pod(n: int) -> int:
    values = {"n": n}
    return values["missing"]


def _render(function, requirements=(), image=BASE_IMAGE):
    from airflow.sdk import DAG

    from airflow_gpu_provider import GpuStepOperator

    with DAG("pod_in_docker", schedule=None):
        task = GpuStepOperator(
            task_id="t",
            python_callable=function,
            op_args=[7],
            backend="kubernetes",
            parent_image=image,
            requirements=list(requirements),
            cpu_count=1,
            memory="1Gi",
            shm_size="256Mi",
        )
    return task.render_manifests()  # the task's Secret and the pod


def test_init_container_installs_requirements_and_main_container_returns_the_value():
    before = leftover_containers()
    run = run_pod(_render(uses_a_requirement, ["six==1.17.0"]))
    assert run.exit_codes == {"install-requirements": 0, "base": 0}, run.logs
    assert "+ six==1.17.0" in run.logs["install-requirements"]
    assert "deprecated" not in run.logs["install-requirements"]  # the CA variable this uv knows
    log = run.logs["base"]
    assert f"[gpu] backend=kubernetes image={BASE_IMAGE}" in log
    assert "[gpu] resources: no GPU, 1 CPUs, 1.0 GiB memory, 256.0 MiB shm" in log
    assert "[gpu] GPUs assigned: none (running on CPU)" in log
    assert result_value(run.result, 0, where="the pod") == {"square": 49, "six": "1.17.0"}
    assert leftover_containers() == before


@pytest.fixture
def image_with_six(tmp_path):
    """The base image plus six installed with pip: a stand-in for a CUDA image that ships packages."""
    tag = "airflow-gpu-test-six:latest"
    (tmp_path / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nRUN python3 -m pip install --quiet --break-system-packages six==1.17.0\n"
    )
    subprocess.run(["docker", "build", "-q", "--rm", "--force-rm", "-t", tag, str(tmp_path)], check=True)
    yield tag
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)


def test_requirements_the_image_already_has_are_not_installed_again(image_with_six):
    run = run_pod(_render(uses_a_requirement, ["six>=1.16"], image=image_with_six))
    assert run.exit_codes == {"install-requirements": 0, "base": 0}, run.logs
    assert "the image already satisfies every requirement" in run.logs["install-requirements"]
    assert result_value(run.result, 0, where="the pod") == {"square": 49, "six": "1.17.0"}


def test_exception_in_the_pod_shows_its_traceback_and_becomes_a_remote_task_error():
    run = run_pod(_render(raises_inside_the_pod))
    assert run.exit_codes == {"base": 1}
    log = run.logs["base"]
    assert "[gpu] the task raised KeyError: 'missing'" in log  # one line; the worker logs the traceback at ERROR
    assert "Traceback" not in log
    with pytest.raises(RemoteTaskError) as err:
        result_value(run.result, 1, where="pod ml/t-abc")
    assert err.value.error_type == "KeyError"
    assert "test_k8s_pod_in_docker.py" in err.value.remote_traceback
    assert 'return values["missing"]' in err.value.remote_traceback  # the DAG file's own source line


def uses_the_private_package(n: int) -> dict:
    import airflow_gpu_private

    return {"square": n * n, "private": airflow_gpu_private.SECRET_PACKAGE}


def test_index_credentials_come_from_a_secret_and_never_appear_in_the_pod(tmp_path):
    from airflow.sdk import DAG
    from backends.docker.docker_fixtures import make_wheel
    from private_index import docker_host_address, private_index

    from airflow_gpu_provider import GpuStepOperator, ImageSettings

    make_wheel(tmp_path / "wheels", "airflow_gpu_private", "1.0", "SECRET_PACKAGE = True\n")
    gateway = docker_host_address()
    with private_index(tmp_path / "wheels") as index:
        image = ImageSettings(
            parent_image=BASE_IMAGE, requirements=["airflow-gpu-private==1.0"], index_url=index.url(gateway)
        )
        with DAG("pod_in_docker_private", schedule=None):
            with pytest.raises(InvalidSettingError, match="index_secret"):  # credentials would be in the pod spec
                GpuStepOperator(
                    task_id="t", python_callable=uses_the_private_package, backend="kubernetes", image=image
                )
            task = GpuStepOperator(
                task_id="t2",
                python_callable=uses_the_private_package,
                op_args=[6],
                backend="kubernetes",
                image=image,
                backend_options={"index_secret": "pypi-credentials"},
            )
        objects = task.render_manifests()
        assert index.password not in json.dumps(objects)
        netrc = f"machine {gateway} login {index.user} password {index.password}\n"
        run = run_pod(objects, secrets={"pypi-credentials": {"netrc": netrc}})
        assert index.authorized, run.logs
    assert run.exit_codes == {"install-requirements": 0, "base": 0}, run.logs
    assert index.password not in run.logs["install-requirements"]
    assert result_value(run.result, 0, where="the pod") == {"square": 36, "private": True}
