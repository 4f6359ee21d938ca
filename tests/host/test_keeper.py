"""The keeper holds GPU locks while a process it does not own runs, whatever happens to the worker."""

from __future__ import annotations

import subprocess
import time

import pytest

from airflow_gpu_provider.host.allocator import GpuAllocator
from airflow_gpu_provider.host.inventory import Device
from airflow_gpu_provider.host.keeper import Keeper

DEVICES = [Device("0"), Device("1")]


def test_the_locks_live_until_the_kept_process_ends(tmp_path):
    allocator = GpuAllocator(tmp_path)
    held = allocator.try_acquire(DEVICES, 2, "dag.task run r1")
    target = subprocess.Popen(["sleep", "600"])
    try:
        keeper = Keeper(target.pid, held.fds)
        held.release()  # as a killed worker's descriptors close
        assert allocator.try_acquire(DEVICES, 1, "other") is None, "the keeper holds them"
        target.kill()
        target.wait()
        keeper.process.wait(timeout=10)  # it notices at once (pidfd), not after a poll
        allocation = allocator.try_acquire(DEVICES, 2, "other")
        assert allocation is not None
        allocation.release()
    finally:
        target.kill()
        target.wait()


def test_stop_releases_at_once(tmp_path):
    allocator = GpuAllocator(tmp_path)
    held = allocator.try_acquire(DEVICES[:1], 1, "dag.task run r1")
    target = subprocess.Popen(["sleep", "600"])
    try:
        keeper = Keeper(target.pid, held.fds)
        held.release()
        started = time.monotonic()
        keeper.stop()
        assert time.monotonic() - started < 5
        allocation = allocator.try_acquire(DEVICES[:1], 1, "other")
        assert allocation is not None
        allocation.release()
    finally:
        target.kill()
        target.wait()


def test_a_process_that_is_not_the_container_is_refused(tmp_path):
    target = subprocess.Popen(["sleep", "600"])
    try:
        with pytest.raises(ValueError, match="is not container 0123456789ab"):
            Keeper(target.pid, [], container_id="0123456789abcdef")
    finally:
        target.kill()
        target.wait()
    with pytest.raises(ValueError, match="is not here"):
        Keeper(target.pid, [])  # gone


def test_the_keeper_holds_none_of_the_workers_streams(tmp_path):
    """Whoever reads a killed worker's output (Airflow's supervisor) must see its end, though the keeper stays."""
    import sys

    target = subprocess.Popen(["sleep", "600"])
    worker = subprocess.Popen(
        [sys.executable, "-c", f"from airflow_gpu_provider.host.keeper import Keeper; Keeper({target.pid}, [])"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        worker.communicate(timeout=30)  # EOF: the keeper (still running) holds no end of this pipe
    finally:
        target.kill()
        target.wait()
