"""Rebuilds that reuse: a derived image whose requirements changed is built on the one that shares most of them."""

from __future__ import annotations

import json

import pytest
from backends.docker.docker_fixtures import BASE_IMAGE, TEST_REPOSITORY, make_wheel

from airflow_gpu_provider.backends.docker.backend import DockerBackend
from airflow_gpu_provider.backends.docker.images.reuse import DEPTH_LABEL, RECIPE_LABEL, REQUIREMENTS_LABEL
from airflow_gpu_provider.backends.docker.options import DockerOptions
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.callable import shipped_callable
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.request import TaskRequest

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaks")]


def versions() -> dict:
    import importlib

    found = {}
    for name in ("airflow_gpu_reuse_a", "airflow_gpu_reuse_b"):
        try:
            found[name] = importlib.import_module(name).VERSION
        except ImportError:
            found[name] = None
    return found


def test_a_changed_requirement_list_is_built_on_the_image_that_shares_it(docker_client, task_log, build_inputs):
    """Added: built on the earlier image, which it then contains. Removed: built from the parent, without it. Another
    version: built on the image that holds nothing else (never on one holding the old version)."""
    wheels = build_inputs / "wheels"
    make_wheel(wheels, "airflow_gpu_reuse_a", "1.0", "VERSION = '1.0'\n")
    make_wheel(wheels, "airflow_gpu_reuse_a", "1.1", "VERSION = '1.1'\n")
    make_wheel(wheels, "airflow_gpu_reuse_b", "2.0", "VERSION = '2.0'\n")
    backend = DockerBackend(DockerOptions.parse({"repository": TEST_REPOSITORY}), log=task_log[0])

    def run(*requirements: str) -> tuple[dict, dict]:
        image = ImageSettings(parent_image=BASE_IMAGE, requirements=list(requirements), find_links=[str(wheels)])
        envelope = Envelope.call(shipped_callable(versions, owner="test"), [], {})
        request = TaskRequest(ResourceSettings(), image, envelope, "fail", {"dag_id": "d", "task_id": "t"})
        value = backend.run(backend.plan(request, GpuConfig.read()), {}).return_value
        label = f"airflow-gpu-provider.requirements-hash={image.requirements_hash}"
        (built,) = docker_client.images(name=TEST_REPOSITORY, filters={"label": label})
        return value, built

    first, first_image = run("airflow-gpu-reuse-a==1.0")
    assert first == {"airflow_gpu_reuse_a": "1.0", "airflow_gpu_reuse_b": None}
    assert "Building on" not in task_log[1].text
    labels = first_image["Labels"]
    assert labels[DEPTH_LABEL] == "0" and len(json.loads(labels[REQUIREMENTS_LABEL])) == 1
    assert "airflow-gpu-reuse-a==1.0" not in json.dumps(labels)  # names and digests, never a requirement's text

    second, second_image = run("airflow-gpu-reuse-a==1.0", "airflow-gpu-reuse-b==2.0")
    assert second == {"airflow_gpu_reuse_a": "1.0", "airflow_gpu_reuse_b": "2.0"}
    assert f"Building on {first_image['Id'][:19]}" in task_log[1].text
    assert "1 of the 2 requirements" in task_log[1].text
    history = {layer["Id"] for layer in docker_client.history(second_image["Id"])}
    assert first_image["Id"] in history  # its layers are the first image's, and one more
    assert second_image["Labels"][DEPTH_LABEL] == "1"
    assert second_image["Labels"][RECIPE_LABEL] == labels[RECIPE_LABEL]
    build_log = task_log[1].text.split(f"Building on {first_image['Id'][:19]}")[1]
    assert "COPY uv" not in build_log  # the base's uv, CA bundle and wheel folders serve

    third, third_image = run("airflow-gpu-reuse-b==2.0")  # every image of the recipe holds a, which it lacks
    assert third == {"airflow_gpu_reuse_a": None, "airflow_gpu_reuse_b": "2.0"}
    assert task_log[1].text.count("Building on") == 1
    assert third_image["Labels"][DEPTH_LABEL] == "0"

    fourth, _ = run("airflow-gpu-reuse-a==1.1", "airflow-gpu-reuse-b==2.0")  # the second image holds a 1.0
    assert fourth == {"airflow_gpu_reuse_a": "1.1", "airflow_gpu_reuse_b": "2.0"}
    assert f"Building on {third_image['Id'][:19]}" in task_log[1].text
