"""The host GPU allocator with real processes, real flocks and real SIGKILLs."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from airflow_gpu_provider.exceptions import GpuUnavailableError
from airflow_gpu_provider.host.allocator import GpuAllocator
from airflow_gpu_provider.host.inventory import Device, matches_model, parse_devices

DEVICES = [Device(str(i)) for i in range(4)]
log = logging.getLogger("test")


def _worker(lock_dir: str, record: str, seed: int, rounds: int) -> None:
    rng = random.Random(seed)
    allocator = GpuAllocator(lock_dir, poll_interval=0.01)
    for _ in range(rounds):
        count = rng.choice([1, 1, 2, 3])
        with allocator.acquire(
            DEVICES, count, policy="wait", holder=f"w{seed}", requested=f"{count}", present=DEVICES, log=log
        ) as allocation:
            start = time.monotonic()
            time.sleep(rng.uniform(0.001, 0.02))
            end = time.monotonic()
        line = json.dumps({"devices": [d.id for d in allocation.devices], "start": start, "end": end})
        fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, (line + "\n").encode())
        os.close(fd)


def test_many_concurrent_processes_never_share_a_gpu(tmp_path):
    record = tmp_path / "intervals.jsonl"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_worker, args=(str(tmp_path / "locks"), str(record), seed, 25)) for seed in range(12)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    assert len(rows) == 12 * 25
    for device in DEVICES:
        spans = sorted((r["start"], r["end"]) for r in rows if device.id in r["devices"])
        assert spans, f"device {device.id} was never used"
        for (_, end), (next_start, _) in zip(spans, spans[1:]):
            assert end <= next_start, f"device {device.id} was shared"


HOLDER = textwrap.dedent(
    """
    import subprocess, sys, time
    from airflow_gpu_provider.host.allocator import GpuAllocator
    from airflow_gpu_provider.host.inventory import Device
    allocation = GpuAllocator(sys.argv[1]).try_acquire([Device("0"), Device("1")], 2, "dag.task run r1")
    assert allocation is not None
    child = None
    if sys.argv[2] == "with-child":  # the task process inherits the lock descriptors, as in the local backend
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], pass_fds=allocation.fds)
        print(child.pid, flush=True)
    print("held", flush=True)
    time.sleep(600)
    """
)


def _start_holder(lock_dir: Path, mode: str) -> tuple[subprocess.Popen, int | None]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock_dir), mode], stdout=subprocess.PIPE, text=True)
    first = proc.stdout.readline().strip()
    child_pid = None
    if mode == "with-child":
        child_pid = int(first)
        first = proc.stdout.readline().strip()
    assert first == "held"
    return proc, child_pid


def test_sigkilled_holder_gpus_are_reusable(tmp_path):
    allocator = GpuAllocator(tmp_path)
    proc, _ = _start_holder(tmp_path, "alone")
    try:
        assert allocator.try_acquire(DEVICES[:2], 1, "other") is None
        assert allocator.holder_of(DEVICES[0]).startswith(f"dag.task run r1 (pid {proc.pid}, for ")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    allocation = allocator.try_acquire(DEVICES[:2], 2, "other")
    assert allocation is not None
    allocation.release()
    assert allocator.holder_of(DEVICES[0]) is None


def test_lock_lives_as_long_as_the_task_process_that_inherited_it(tmp_path):
    allocator = GpuAllocator(tmp_path)
    proc, child_pid = _start_holder(tmp_path, "with-child")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    try:
        assert allocator.try_acquire(DEVICES[:2], 1, "other") is None, "the orphaned task process still runs"
        holder = allocator.holder_of(DEVICES[0])
        assert holder.startswith(f"a process left by dag.task run r1 (its worker, pid {proc.pid}, has exited, for ")
    finally:
        os.kill(child_pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while (allocation := allocator.try_acquire(DEVICES[:2], 2, "other")) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert allocation is not None
    allocation.release()


def test_fail_policy_names_request_inventory_and_holders(tmp_path):
    allocator = GpuAllocator(tmp_path)
    held = allocator.try_acquire(DEVICES, 3, "dag_a.train run r7")
    try:
        with pytest.raises(GpuUnavailableError) as info:
            allocator.acquire(
                DEVICES, 2, policy="fail", holder="b", requested="2x nvidia GPU", present=DEVICES, log=log
            )
    finally:
        held.release()
    message = str(info.value)
    assert "Requested 2x nvidia GPU" in message
    assert "this host has 4 GPU(s)" in message
    assert "free: 3" in message
    assert "0 held by dag_a.train run r7" in message
    assert "on_missing_gpu='wait'" in message


def test_cpu_policy_falls_back_with_a_warning(tmp_path, caplog):
    allocator = GpuAllocator(tmp_path)
    with caplog.at_level(logging.WARNING):
        allocation = allocator.acquire([], 1, policy="cpu", holder="t", requested="1x nvidia GPU", present=[], log=log)
    assert allocation.cpu_fallback
    assert allocation.devices == []
    assert "running on CPU instead" in caplog.text
    assert "this host has no GPUs" in caplog.text


def test_wait_policy_waits_for_release(tmp_path):
    allocator = GpuAllocator(tmp_path, poll_interval=0.05)
    held = allocator.try_acquire(DEVICES[:1], 1, "first")
    threading.Timer(0.5, held.release).start()
    started = time.monotonic()
    with allocator.acquire(
        DEVICES[:1], 1, policy="wait", holder="second", requested="1", present=DEVICES[:1], log=log
    ) as allocation:
        assert [d.id for d in allocation.devices] == ["0"]
    assert time.monotonic() - started >= 0.4


def test_wait_policy_fails_fast_when_the_host_can_never_satisfy_it(tmp_path):
    allocator = GpuAllocator(tmp_path)
    with pytest.raises(GpuUnavailableError, match="Waiting cannot help"):
        allocator.acquire(
            DEVICES[:2], 3, policy="wait", holder="t", requested="3x nvidia GPU", present=DEVICES[:2], log=log
        )


def test_partial_acquisition_is_rolled_back(tmp_path):
    allocator = GpuAllocator(tmp_path)
    held = allocator.try_acquire(DEVICES[2:], 2, "other")
    assert allocator.try_acquire(DEVICES, 3, "greedy") is None
    assert allocator.holder_of(DEVICES[0]) is None  # nothing kept from the failed attempt
    held.release()


def test_configured_inventory_and_model_matching():
    assert parse_devices("auto") is None
    assert parse_devices("none") == []
    assert [d.id for d in parse_devices("0, 1,MIG-abc")] == ["0", "1", "MIG-abc"]
    with pytest.raises(ValueError, match="distinct"):
        parse_devices("0,0")
    a100 = Device("0", "NVIDIA A100-SXM4-80GB")
    assert matches_model(a100, "A100")
    assert matches_model(a100, "A100-80GB")
    assert not matches_model(a100, "A10")
    assert not matches_model(a100, "H100")
    assert matches_model(Device("1"), "H100")  # unknown model: configured by id


@pytest.mark.gpu
def test_the_nvml_inventory_hands_out_the_hosts_real_gpus_one_task_each(real_gpus, tmp_path):
    from airflow_gpu_provider.host.allocator import HostGpus
    from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
    from airflow_gpu_provider.task.envelope import Envelope
    from airflow_gpu_provider.task.request import TaskRequest

    host = HostGpus(devices="auto", state_dir=str(tmp_path))

    def request(count):
        return TaskRequest(ResourceSettings(gpu_count=count), ImageSettings(), Envelope.run(["true"]), "fail")

    assert [d.id for d in host.present(ResourceSettings().gpu_vendor)] == list(real_gpus)
    with host.allocate(request(1), backend="test", log=log) as first:
        (given,) = first.devices
        assert given.id in real_gpus
        with pytest.raises(GpuUnavailableError, match="held by"):  # the held one is never given twice
            host.allocate(request(len(real_gpus)), backend="test", log=log)
    with host.allocate(request(len(real_gpus)), backend="test", log=log) as every:  # released: all of them again
        assert sorted(d.id for d in every.devices) == sorted(real_gpus)


@pytest.mark.parametrize("policy", ["fail", "wait"])
def test_a_host_without_enough_gpus_is_never_told_to_wait(tmp_path, policy):
    """On a laptop (no GPU) waiting cannot help: the message suggests the CPU, a GPU host or [gpu] devices."""
    allocator = GpuAllocator(tmp_path)
    for present, count in (([], 1), (DEVICES[:2], 3)):
        with pytest.raises(GpuUnavailableError) as info:
            allocator.acquire(present, count, policy=policy, holder="t", requested="x", present=present, log=log)
        message = str(info.value)
        assert "on_missing_gpu='wait'" not in message
        assert "on_missing_gpu='cpu' to run on CPU" in message and "[gpu] devices" in message
