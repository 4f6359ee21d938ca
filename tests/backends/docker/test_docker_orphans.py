"""Containers of dead workers: removed before the next task, unless their ``auto_remove`` policy keeps them."""

from __future__ import annotations

import subprocess
import sys

import pytest
from backends.docker.docker_fixtures import BASE_IMAGE
from backends.docker.test_docker_run import add, call, request, run

from airflow_gpu_provider.backends.docker.durable import DEPLOYMENT_LABEL

pytestmark = [pytest.mark.docker]

KEEPING_WORKER = """
import logging, sys
from airflow_gpu_provider.backends import BACKENDS
from airflow_gpu_provider.exceptions import RemoteTaskError
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.request import TaskRequest
from airflow_gpu_provider.config.worker import GpuConfig
backend = BACKENDS["docker"].create({"auto_remove": "never"}, logging.getLogger("w"))
request = TaskRequest(ResourceSettings(), ImageSettings(parent_image=sys.argv[2]), Envelope.run(["false"]))
try:
    backend.run(backend.plan(request, GpuConfig.read()), {})
except RemoteTaskError:
    pass
"""


def test_a_container_kept_for_inspection_outlives_its_worker(docker_client, task_log, state_dir):
    """A worker process ends with its task; the container that ``auto_remove='never'`` kept is not an orphan."""
    subprocess.run([sys.executable, "-c", KEEPING_WORKER, "", BASE_IMAGE], check=True, timeout=120)
    label = {"label": "airflow-gpu-provider.auto-remove=never"}
    kept = [c["Id"] for c in docker_client.containers(all=True, filters=label)]
    assert len(kept) == 1
    try:
        assert run(task_log, request(call(add, 1))).return_value["sum"] == 2
        assert [c["Id"] for c in docker_client.containers(all=True, filters=label)] == kept
        assert "by a worker that died" not in task_log[1].text
    finally:
        docker_client.remove_container(kept[0], force=True)


GPU_WORKER = """
import logging, sys
from airflow_gpu_provider.backends import BACKENDS
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.request import TaskRequest
from airflow_gpu_provider.config.worker import GpuConfig
backend = BACKENDS["docker"].create({}, logging.getLogger("w"))
resources = ResourceSettings(gpu_count=2)
request = TaskRequest(resources, ImageSettings(parent_image=sys.argv[2]), Envelope.run(["sleep", "300"]), "cpu")
backend.run(backend.plan(request, GpuConfig.read()), {})
"""


def test_a_killed_workers_container_keeps_its_gpus_until_it_is_reaped(docker_client, task_log, state_dir, monkeypatch):
    """The GPU locks live as long as the container (host/keeper.py), not as long as the worker process."""
    import signal
    import time

    from airflow_gpu_provider.host.allocator import GpuAllocator
    from airflow_gpu_provider.host.inventory import Device

    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", "0,1")
    worker = subprocess.Popen([sys.executable, "-c", GPU_WORKER, "", BASE_IMAGE])
    label = {"label": "airflow-gpu-provider.worker"}
    deadline = time.monotonic() + 60
    while not (mine := [c for c in docker_client.containers(filters=label) if f":{worker.pid}:" in str(c["Labels"])]):
        assert time.monotonic() < deadline and worker.poll() is None, "the worker's container never started"
        time.sleep(0.2)
    time.sleep(1)
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    locks = GpuAllocator(state_dir / "locks")
    holder = locks.holder_of(Device("0"))
    assert holder is not None and f"its worker, pid {worker.pid}, has exited" in holder  # the container still runs

    dead = mine[0]["Labels"]["airflow-gpu-provider.worker"]  # another Airflow deployment's, on this engine
    theirs = docker_client.create_container(BASE_IMAGE, ["sleep", "300"], labels={
        "airflow-gpu-provider.worker": dead, DEPLOYMENT_LABEL: "staging", "airflow-gpu-provider-test": "orphans"})["Id"]  # fmt: skip
    try:
        result = run(task_log, request(call(add, 1), gpu_count=2, on_missing_gpu="cpu"))
        assert docker_client.containers(all=True, filters={"id": theirs})  # its own workers' to judge
    finally:
        docker_client.remove_container(theirs, force=True)
    assert result.return_value["sum"] == 2
    assert "left running by a worker that died" in task_log[1].text
    assert "GPUs ['0', '1'] from the host allocator" in task_log[1].text  # free again once the orphan was reaped
    assert docker_client.containers(all=True, filters={"id": mine[0]["Id"]}) == []
    assert locks.holder_of(Device("0")) is None and locks.holder_of(Device("1")) is None
