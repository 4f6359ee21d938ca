"""Containers of dead workers: removed before the next task, unless their ``auto_remove`` policy keeps them."""

from __future__ import annotations

import subprocess
import sys

import pytest
from backends.docker.docker_fixtures import BASE_IMAGE
from backends.docker.test_docker_run import add, call, request, run

pytestmark = [pytest.mark.docker]

KEEPING_WORKER = """
import logging, sys
from airflow_gpu_provider.backends import BACKENDS
from airflow_gpu_provider.exceptions import RemoteTaskError
from airflow_gpu_provider.payload import command_envelope
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.request import TaskRequest
backend = BACKENDS["docker"].create({"state_dir": sys.argv[1], "auto_remove": "never"}, logging.getLogger("w"))
request = TaskRequest(ResourceSettings(), ImageSettings(parent_image=sys.argv[2]), command_envelope(["false"]))
try:
    backend.run(backend.plan(request), {})
except RemoteTaskError:
    pass
"""


def test_a_container_kept_for_inspection_outlives_its_worker(docker_client, task_log, tmp_path):
    """A worker process ends with its task; the container that ``auto_remove='never'`` kept is not an orphan."""
    subprocess.run([sys.executable, "-c", KEEPING_WORKER, str(tmp_path), BASE_IMAGE], check=True, timeout=120)
    label = {"label": "airflow-gpu-provider.auto-remove=never"}
    kept = [c["Id"] for c in docker_client.containers(all=True, filters=label)]
    assert len(kept) == 1
    try:
        assert run(task_log, request(call(add, 1)), {"state_dir": str(tmp_path)}).return_value["sum"] == 2
        assert [c["Id"] for c in docker_client.containers(all=True, filters=label)] == kept
        assert "by a worker that died" not in task_log[1].text
    finally:
        docker_client.remove_container(kept[0], force=True)
