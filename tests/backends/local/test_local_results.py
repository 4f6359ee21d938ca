"""The local backend reads the task's result without trusting what the task left at its path."""

from __future__ import annotations

import json
import time

import pytest

from airflow_gpu_provider.backends import BACKENDS
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.request import TaskRequest
from airflow_gpu_provider.task.result import ResultError


def run_command(tmp_path, script: str):
    backend = BACKENDS["local"].create({})
    request = TaskRequest(ResourceSettings(), ImageSettings(), Envelope.run(["sh", "-c", script]))
    return backend.run(backend.plan(request, GpuConfig.read()), {})


@pytest.mark.parametrize(
    ("script", "fragment"),
    [
        (
            "rm result.json && ln -s {secret} result.json",
            "cannot be read safely",
        ),  # a file the task could not have written
        ("rm result.json && mkfifo result.json", "not a regular file"),  # used to block the worker forever
        ("rm result.json && mkdir result.json", "not a regular file"),
        ("head -c 70000000 /dev/zero > result.json", "larger than"),
    ],
)
def test_what_the_task_leaves_at_the_result_path_is_never_followed(tmp_path, script, fragment):
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"ok": True, "return_value": "the worker's secret"}))
    started = time.monotonic()
    with pytest.raises(ResultError, match=fragment):
        run_command(tmp_path, script.format(secret=secret))
    assert time.monotonic() - started < 30
