"""On a host whose GPUs are known, Docker tasks take devices from the same host allocator as local tasks.

Most tests list fake device ids and run on an engine without the NVIDIA runtime; the gpu-marked one uses the host's
real GPUs and an engine that can start GPU containers.
"""

from __future__ import annotations

import re

import pytest
from backends.docker.test_docker_run import add, call, request, run

from airflow_gpu_provider.exceptions import GpuUnavailableError
from airflow_gpu_provider.host.allocator import GpuAllocator
from airflow_gpu_provider.host.inventory import Device

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaks")]


@pytest.fixture
def two_gpus(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", "0,1")
    monkeypatch.setenv("AIRFLOW__GPU__STATE_DIR", str(tmp_path))
    return GpuAllocator(tmp_path / "locks")


def test_a_gpu_held_by_a_local_task_is_not_given_to_a_container(two_gpus, task_log, no_gpu_runtime):
    held = two_gpus.try_acquire([Device("0")], 1, "dag.local_task run r1")
    try:
        result = run(task_log, request(call(add, 1), gpu_count=1, on_missing_gpu="cpu"))
    finally:
        held.release()
    text = task_log[1].text
    assert "GPUs ['1'] from the host allocator" in text  # not GPU 0: the local task has it
    assert "cannot start GPU containers" in text  # then this engine has no NVIDIA runtime: CPU fallback
    assert result.return_value["sum"] == 2
    assert two_gpus.holder_of(Device("1")) is None  # released after the run


def test_busy_gpus_fail_fast_before_any_container_exists(two_gpus, task_log):
    held = two_gpus.try_acquire([Device("0"), Device("1")], 2, "dag.other run r2")
    try:
        with pytest.raises(
            GpuUnavailableError, match=r"Requested 1x nvidia GPU but this host has 2 GPU\(s\).*held by dag.other"
        ):
            run(task_log, request(call(add, 1), gpu_count=1, on_missing_gpu="fail"))
    finally:
        held.release()
    assert "from the host allocator" not in task_log[1].text


def test_cpu_policy_with_busy_gpus_runs_a_cpu_container(two_gpus, task_log):
    held = two_gpus.try_acquire([Device("0"), Device("1")], 2, "dag.other run r3")
    try:
        result = run(task_log, request(call(add, 4), gpu_count=2, on_missing_gpu="cpu"))
    finally:
        held.release()
    assert result.return_value == {"sum": 5, "user": 0, "visible": "void"}
    assert "running on CPU instead" in task_log[1].text


def gpu_identity() -> dict:
    import os
    import subprocess

    listed = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True, text=True, check=True
    ).stdout.split()
    return {"visible": os.environ.get("NVIDIA_VISIBLE_DEVICES"), "listed": listed}


@pytest.mark.gpu
def test_a_gpu_container_sees_exactly_the_gpu_the_host_allocator_gave_it(real_gpus, gpu_runtime, state_dir, task_log):
    result = run(task_log, request(call(gpu_identity), gpu_count=1))
    text = task_log[1].text
    given = re.search(r"GPUs \['([^']+)'\] from the host allocator", text)
    assert given is not None, text
    assert given.group(1) in real_gpus
    assert result.return_value == {"visible": given.group(1), "listed": [given.group(1)]}
    assert "[gpu] GPUs assigned: none" not in text  # the runtime in the container found the GPU too
    assert GpuAllocator(state_dir / "locks").holder_of(Device(given.group(1))) is None  # released after the run


def test_a_share_for_a_container_lands_beside_a_local_share_and_is_capped_by_pytorch(
    two_gpus, task_log, no_gpu_runtime
):
    """Shares gather on the GPU that has some already; in a container a share is PyTorch's cap (MPS would need the
    host's IPC namespace). This engine has no NVIDIA runtime: the try falls back to the CPU, and frees its share."""
    from airflow_gpu_provider.settings.shares import GpuShare

    held = two_gpus.acquire(
        [Device("0"), Device("1")], 1, policy="fail", holder="dag.local_share run r4", requested="half a GPU",
        present=[Device("0"), Device("1")], log=task_log[0], share=GpuShare(fraction=0.5),
    )  # fmt: skip
    try:
        result = run(task_log, request(call(add, 2), gpu_count=0.5, on_missing_gpu="cpu"))
    finally:
        held.release()
    text = task_log[1].text
    assert held.devices == [Device("0")] and "GPUs ['0'] from the host allocator" in text  # beside the local share
    assert "a share of 50 % of GPU 0 (model unknown), enforced by PyTorch's cap" in text
    assert "in a container (MPS needs the host's IPC namespace)" in text and result.return_value["sum"] == 3
    assert two_gpus.holder_of(Device("0")) is None and not list(two_gpus.lock_dir.glob("*.share-*"))
