"""A task shares its host's GPUs with every other task: no lock namespace of its own, no device outside the host's.

M2 of issue 27: ``backend_options={"state_dir": ...}`` gave a task a lock folder of its own, where it took GPUs that
were quarantined or that other tasks held; the local backend's ``devices`` replaced ``[gpu] devices`` (any id the
author named), and the Docker backend's ``devices`` skipped the allocator altogether. A task's ``devices`` now only
narrows the host's GPUs: it still takes their locks and respects their quarantine. And a GPU that is quarantined is
named as such (which, until when), not blamed on the request.
"""

from __future__ import annotations

import logging
import time

import pytest

from airflow_gpu_provider import GpuStepOperator
from airflow_gpu_provider.backends import BACKENDS
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.exceptions import GpuUnavailableError, InvalidSettingError
from airflow_gpu_provider.host import quarantine
from airflow_gpu_provider.host.allocator import GpuAllocator
from airflow_gpu_provider.host.inventory import Device
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.request import TaskRequest

log = logging.getLogger("test.task_devices")


@pytest.fixture
def two_gpus(monkeypatch, state_dir):
    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", "0,1")
    return state_dir


def one_gpu(on_missing_gpu: str = "fail") -> TaskRequest:
    return TaskRequest(ResourceSettings(gpu_count=1), ImageSettings(), Envelope.run(["true"]), on_missing_gpu, {})


@pytest.mark.parametrize("backend", ["local", "docker", "executor"])
def test_m2_no_task_has_a_state_dir_of_its_own(backend, tmp_path):
    with pytest.raises(InvalidSettingError, match=r"'state_dir'.*no state dir of its own.*\[gpu\] state_dir"):
        GpuStepOperator(task_id="t", command=["true"], backend=backend, backend_options={"state_dir": str(tmp_path)})


def test_m2_a_tasks_devices_only_narrow_the_hosts(two_gpus):
    host = BACKENDS["local"].create({"devices": "1"}, log).plan(one_gpu(), GpuConfig.read()).host
    with host.allocate(one_gpu(), backend="local", log=log) as allocation:
        assert [device.id for device in allocation.devices] == ["1"]
        with pytest.raises(GpuUnavailableError, match="held by"):  # its lock is the host's: taken while held
            host.allocate(one_gpu(), backend="local", log=log)
    outside = BACKENDS["local"].create({"devices": "2,3"}, log).plan(one_gpu(), GpuConfig.read()).host
    with pytest.raises(GpuUnavailableError, match=r"backend_options devices.*'2', '3'.*\[gpu\] devices"):
        outside.allocate(one_gpu(), backend="local", log=log)


def test_quarantined_gpus_are_named_with_their_end_not_blamed_on_the_request(two_gpus):
    quarantine.quarantine(two_gpus, [Device("0")], "Xid 79 (GPU has fallen off the bus)", 600, log)
    host = BACKENDS["local"].create({"devices": "0"}, log).plan(one_gpu(), GpuConfig.read()).host
    until = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(quarantine.quarantined(two_gpus)["0"]["until"]))
    with pytest.raises(GpuUnavailableError) as refused:
        host.allocate(one_gpu(), backend="local", log=log)
    message = str(refused.value)
    assert f"GPU 0 is quarantined until {until}" in message and "Xid 79" in message, message
    assert "does not have that many" not in message and "[gpu] devices" not in message, message


@pytest.mark.docker
@pytest.mark.usefixtures("no_leaks")
def test_m2_a_docker_tasks_devices_go_through_the_allocator(two_gpus, task_log):
    from backends.docker.test_docker_run import add, call, request, run

    held = GpuAllocator(two_gpus / "locks").try_acquire([Device("0")], 1, "dag.local_task run r1")
    try:
        with pytest.raises(GpuUnavailableError, match="held by dag.local_task"):
            run(task_log, request(call(add, 1), gpu_count=1, on_missing_gpu="fail"), {"devices": ["0"]})
    finally:
        held.release()
    quarantine.quarantine(two_gpus, [Device("1")], "Xid 48 (double-bit ECC error)", 600, log)
    with pytest.raises(GpuUnavailableError, match="GPU 1 is quarantined until"):
        run(task_log, request(call(add, 1), gpu_count=1, on_missing_gpu="fail"), {"devices": ["1"]})
