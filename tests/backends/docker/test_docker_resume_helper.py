"""A script in a container imports the resume helper from the runtime's archive, and no torch with it."""

from __future__ import annotations

import pytest
from backends.docker.docker_fixtures import BASE_IMAGE

from airflow_gpu_provider.backends.docker.backend import DockerBackend
from airflow_gpu_provider.backends.docker.options import DockerOptions
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.request import TaskRequest

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaks")]
LABELS = {"dag_id": "docker_tests", "task_id": "t", "run_id": "r", "try_number": "1", "map_index": "-1"}
SCRIPT = (
    "import sys; from airflow_gpu_runtime import resume; "
    "print('helper from', resume.__module__, sys.modules['airflow_gpu_runtime'].__file__, "
    "'torch loaded:', 'torch' in sys.modules)"
)


def test_a_command_in_a_container_imports_the_helper_from_the_runtime_archive(task_log):
    request = TaskRequest(
        ResourceSettings(),
        ImageSettings(parent_image=BASE_IMAGE),
        Envelope.run(["python3", "-c", SCRIPT]),
        "fail",
        LABELS,
    )
    backend = DockerBackend(DockerOptions.parse({}), log=task_log[0])
    result = backend.run(backend.plan(request, GpuConfig.read()), {})
    assert result.return_value is None  # exit status 0
    text = task_log[1].text
    assert "helper from airflow_gpu_runtime.resuming" in text and "runtime.pyz/airflow_gpu_runtime/__init__.py" in text
    assert "torch loaded: False" in text
