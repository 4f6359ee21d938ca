"""AccelerateOperator on the Docker backend: a real 2-process CPU launch inside a container."""

from __future__ import annotations

from pathlib import Path

import pytest
from backends.docker.docker_fixtures import BASE_IMAGE, TEST_REPOSITORY
from helpers import load_dag, run_dag, task_states, xcom

from airflow_gpu_provider import ImageSettings

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.usefixtures("no_leaks")]
REPO = Path(__file__).resolve().parents[3]


def test_two_cpu_processes_in_a_container_with_cpu_fallback(airflow_home, docker_client, monkeypatch, task_log):
    """gpu_count=2 on a host without the NVIDIA runtime: the container runs on CPU, and accelerate starts 2 ranks."""
    from uv import find_uv_bin

    from airflow_gpu_provider.images.dockerfile import BuildOptions, derived_image_spec
    from airflow_gpu_provider.images.engine import ensure_derived_image

    wheels = Path("/opt/wheels")
    if not any(wheels.glob("torch-*.whl")):
        pytest.skip("no torch wheel in /opt/wheels to build an image with torch")
    image = ImageSettings(
        parent_image=BASE_IMAGE, requirements=["torch==2.13.0", "accelerate==1.15.0"], find_links=[str(wheels)]
    )
    spec = derived_image_spec(BASE_IMAGE, image, BuildOptions(repository=TEST_REPOSITORY), uv_binary=find_uv_bin())
    reference, _ = ensure_derived_image(
        docker_client,
        spec,
        docker_client.inspect_image(BASE_IMAGE)["Id"],
        lock_dir=str(airflow_home / "locks"),
        push=False,
        log=task_log[0],
    )
    monkeypatch.setenv("AIRFLOW__GPU__DEFAULT_PARENT_IMAGE", reference)

    dag_run = run_dag(load_dag(REPO / "tests" / "dags" / "accelerate_dags.py", "accelerate_docker"))
    assert task_states(dag_run) == {"train": "success"}
    result = xcom(dag_run, "train")
    assert result["world_size"] == 2  # seen by the ranks inside the container
    assert result["ranks"] == [0, 1]
    assert result["backend"] == "gloo"
    assert result["last_loss"] < result["first_loss"]
