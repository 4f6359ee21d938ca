"""Waiting for GPUs in the triggerer (``on_missing_gpu="wait"``, ``deferrable=True``), with real locks.

The host's one GPU is listed (``[gpu] devices = 0``) and held by this test through the real allocator; the task
defers to :class:`GpuFreeTrigger`, which ``dag.test()`` runs in line, and starts when the test lets the GPU go.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import threading
import time
from pathlib import Path

import pytest
from helpers import start_worker, worker_result

from airflow_gpu_provider.exceptions import GpuUnavailableError
from airflow_gpu_provider.host.allocator import GpuAllocator, HostGpus
from airflow_gpu_provider.host.inventory import Device
from airflow_gpu_provider.host.trigger import GpuFreeTrigger
from airflow_gpu_provider.host.waiting import MustWait, free_count

DAG_FILE = Path(__file__).resolve().parents[1] / "dags" / "deferral_dags.py"
log = logging.getLogger("test")


@pytest.fixture
def one_gpu(monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", "0")
    return GpuAllocator(Path(os.environ["AIRFLOW__GPU__STATE_DIR"]) / "locks")


def test_free_count_reads_the_locks_without_taking_them(tmp_path):
    allocator = GpuAllocator(tmp_path)
    held = allocator.try_acquire([Device("0")], 1, "test")
    assert held is not None
    files = [str(allocator.lock_path(Device(i))) for i in ("0", "1")]
    assert free_count(files) == 1  # "1" has no lock file yet: never taken
    descriptor = os.open(files[0], os.O_RDONLY)
    with pytest.raises(BlockingIOError):  # the probe left the holder's lock whole
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(descriptor)
    held.release()
    assert free_count(files) == 2


def test_the_allocator_raises_must_wait_instead_of_sleeping(tmp_path):
    allocator = GpuAllocator(tmp_path)
    held = allocator.try_acquire([Device("0")], 1, "the other task")
    with pytest.raises(MustWait) as raised:
        allocator.acquire(
            [Device("0")], 1, policy="wait", holder="t", requested="1x nvidia GPU", present=[Device("0")], log=log,
            timeout=60, defer=True,
        )  # fmt: skip
    assert raised.value.lock_files == [str(allocator.lock_path(Device("0")))] and raised.value.timeout == 60
    assert "held by the other task" in str(raised.value)
    with pytest.raises(GpuUnavailableError, match="Waiting cannot help"):  # more than the host has: no deferral
        allocator.acquire(
            [Device("0")], 2, policy="wait", holder="t", requested="2x nvidia GPU", present=[Device("0")], log=log,
            defer=True,
        )  # fmt: skip
    held.release()


def test_a_blocking_wait_ends_at_its_timeout(tmp_path):
    allocator = GpuAllocator(tmp_path, poll_interval=0.1)
    held = allocator.try_acquire([Device("0")], 1, "the other task")
    started = time.monotonic()
    with pytest.raises(GpuUnavailableError, match=r"Waited \d+s for 1x nvidia GPU .*wait_timeout"):
        allocator.acquire(
            [Device("0")], 1, policy="wait", holder="t", requested="1x nvidia GPU", present=[Device("0")], log=log,
            timeout=0.5,
        )  # fmt: skip
    assert time.monotonic() - started < 5
    held.release()


def test_the_trigger_fires_when_the_gpu_is_let_go_and_at_its_deadline(tmp_path):
    allocator = GpuAllocator(tmp_path)
    held = allocator.try_acquire([Device("0")], 1, "the other task")
    assert held is not None
    files = [str(allocator.lock_path(Device("0")))]
    threading.Timer(1.0, held.release).start()

    async def first_event(trigger: GpuFreeTrigger) -> dict:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("no event")

    started = time.monotonic()
    event = asyncio.run(first_event(GpuFreeTrigger(files, 1, time.time() + 30, poll_interval=0.1)))
    assert event["status"] == "free" and 0.9 < time.monotonic() - started < 5
    again = allocator.try_acquire([Device("0")], 1, "the other task")
    event = asyncio.run(first_event(GpuFreeTrigger(files, 1, time.time() + 0.5, poll_interval=0.1)))
    assert event["status"] == "timeout"
    assert again is not None
    again.release()
    path, arguments = GpuFreeTrigger(files, 1, 1e12, poll_interval=0.5, requested="1x GPU").serialize()
    assert path == "airflow_gpu_provider.host.trigger.GpuFreeTrigger"
    assert json.loads(json.dumps(arguments)) == arguments
    assert GpuFreeTrigger(**arguments).serialize() == (path, arguments)


def test_a_trigger_row_cannot_block_the_triggerers_loop(tmp_path, monkeypatch):
    """Issue 34, low: a DAG's own GpuFreeTrigger with 200,000 lock files and poll_interval=0 blocked the triggerer's
    event loop (each look read them all on the loop, with no pause between looks). Too many files are refused, the
    pause has a floor, and each look runs off the loop.
    """
    from airflow_gpu_provider.host.trigger import MAX_LOCKS, MIN_POLL

    with pytest.raises(ValueError, match=f"{MAX_LOCKS} lock files at most, not 200000"):
        GpuFreeTrigger([str(tmp_path / str(n)) for n in range(200_000)], 1, time.time() + 60, poll_interval=0)
    looks = []

    async def run() -> tuple[dict, int]:
        ticks = 0

        async def ticker() -> None:  # the loop's other work goes on while the trigger waits
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        beside = asyncio.ensure_future(ticker())
        trigger = GpuFreeTrigger(
            [str(tmp_path / "held")] * MAX_LOCKS, MAX_LOCKS + 1, time.time() + 0.5, poll_interval=0
        )
        assert trigger.poll_interval == MIN_POLL
        async for event in trigger.run():
            beside.cancel()
            return dict(event.payload), ticks
        raise AssertionError("no event")

    import airflow_gpu_provider.host.trigger as module

    counted = module.ready
    monkeypatch.setattr(module, "ready", lambda *args: looks.append(1) or counted(*args))
    event, ticks = asyncio.run(run())
    assert event["status"] == "timeout" and len(looks) <= 0.5 / MIN_POLL + 2 and ticks > 10, (len(looks), ticks)


@pytest.mark.usefixtures("airflow_home")
def test_a_task_waits_deferred_then_runs_on_the_gpu(one_gpu):
    held = one_gpu.try_acquire([Device("0")], 1, "the other task")
    assert held is not None
    worker = start_worker(DAG_FILE, "deferred_wait", env={"AIRFLOW__GPU__DEVICES": "0"})
    lines: list[str] = []

    def read() -> None:  # the worker's task log, as it comes: the GPU is let go once the task has deferred
        for line in worker.stdout:
            lines.append(line)
            if "Deferred until they are free" in line:
                threading.Timer(2.0, held.release).start()  # the trigger sees it busy first

    reader = threading.Thread(target=read)
    reader.start()
    try:
        worker.wait(timeout=240)
        reader.join(timeout=30)
    finally:
        held.release()
    log_text = "".join(lines)
    result = worker_result(log_text)
    assert result["states"] == {"waits_for_the_gpu": "success"}, log_text[-3000:]
    assert str(result["xcom"]["waits_for_the_gpu"]) == "0"  # the one GPU, once it was free
    assert "held by the other task" in log_text and "Deferred until they are free" in log_text
    assert "running trigger in line" in log_text and "GPUs free after" in log_text


@pytest.mark.usefixtures("airflow_home")
def test_a_deferred_wait_ends_at_its_timeout_naming_it(one_gpu):
    held = one_gpu.try_acquire([Device("0")], 1, "the other task")
    try:
        worker = start_worker(DAG_FILE, "deferred_wait_timeout", env={"AIRFLOW__GPU__DEVICES": "0"})
        log_text, _ = worker.communicate(timeout=240)
    finally:
        held.release()
    assert worker_result(log_text)["states"] == {"gives_up": "failed"}, log_text[-3000:]
    assert "GpuUnavailableError: Waited" in log_text and "wait_timeout" in log_text


def test_host_gpus_carry_the_wait_timeout():
    from airflow_gpu_provider.config.worker import GpuConfig

    assert HostGpus.configured(GpuConfig.read(wait_timeout=12.0)).wait_timeout == 12.0
