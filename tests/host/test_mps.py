"""How a share is enforced (``host/mps.py``): MPS's variables, PyTorch's cap, or a refusal, said in the log.

No GPU and no MPS here: the admin's daemon is a real unix socket in a pipe folder (what the provider looks for), and
the provider's own daemon is ``nvidia-cuda-mps-control`` replaced by a script that records how it was called and
keeps a pid file as the real one does. ``make gpu-check`` runs the real MPS on a lent GPU (its ``shares`` row).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import time
from pathlib import Path

import pytest
from helpers import alive

from airflow_gpu_provider.exceptions import GpuUnavailableError
from airflow_gpu_provider.host.allocator import GpuAllocator
from airflow_gpu_provider.host.inventory import Device
from airflow_gpu_provider.host.mps import FRAMEWORK, MPS, NONE, ShareEnforcer, admin_pipes, shared
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.settings.shares import GpuShare
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.request import TaskRequest

GIB = 2**30
GPU = Device("GPU-00000000-0000-0000-0000-000000000000", "NVIDIA GeForce RTX 4090", 24 * GIB, "0")
log = logging.getLogger("test")


@pytest.fixture
def pipes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An admin's MPS pipe folder with its control socket listening; the worker's environment points at it."""
    folder = tmp_path / "mps-pipes"
    folder.mkdir(mode=0o700)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(folder / "control"))
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(folder))
    yield folder
    listener.close()


def test_the_admins_daemon_gives_each_share_its_memory_limit_and_compute_percentage(pipes, caplog):
    enforcer = ShareEnforcer(str(pipes.parent / "state"), log, in_container=False, allow_unenforced=False)
    with caplog.at_level(logging.INFO):
        enforcement = enforcer.enforce(GPU, 8 * GIB, 3334, command=False)
    assert enforcement.kind == MPS
    assert enforcement.environment == {
        "CUDA_MPS_PIPE_DIRECTORY": str(pipes),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M",  # device 0: the one GPU the task sees
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "34",
    }
    assert enforcer.daemon(GPU) is None  # the admin's daemon: the provider starts none
    assert (
        "a share of 8.0 GiB (34 %) of GPU GPU-00000000-0000-0000-0000-000000000000 (NVIDIA GeForce RTX 4090), "
        "enforced by MPS (the admin's daemon): CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M, "
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=34" in caplog.text
    )


@pytest.mark.parametrize("mode", [0o777, 0o770])
def test_a_pipe_folder_others_may_write_to_is_no_daemon_to_trust(pipes, mode):
    pipes.chmod(mode)
    assert admin_pipes() is None  # another user's "daemon" there would see the task's GPU work


def test_a_pipe_folder_that_is_a_symlink_or_has_no_socket_is_not_a_daemon(tmp_path, pipes):
    link = tmp_path / "link"
    link.symlink_to(pipes)
    assert admin_pipes({"CUDA_MPS_PIPE_DIRECTORY": str(link)}) is None
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    assert admin_pipes({"CUDA_MPS_PIPE_DIRECTORY": str(empty)}) is None
    assert admin_pipes() == pipes


def test_without_mps_pytorchs_cap_enforces_a_function_and_a_command_is_refused_unless_allowed(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "none"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-cuda-mps-control
    strict = ShareEnforcer(str(tmp_path), log, in_container=False, allow_unenforced=False)
    capped = strict.enforce(GPU, 6 * GIB, 2500, command=False)
    assert (capped.kind, capped.environment) == (FRAMEWORK, {})
    assert capped.share["fraction"] == 0.25 and capped.share["unenforced_allowed"] is False
    assert "enforced by PyTorch's cap on its CUDA allocator (no MPS on this host)" in capped.share["line"]
    with pytest.raises(GpuUnavailableError, match="cannot be enforced: no MPS on this host, and PyTorch's cap"):
        strict.enforce(GPU, 6 * GIB, 2500, command=True)
    allowed = ShareEnforcer(str(tmp_path), log, in_container=False, allow_unenforced=True)
    assert allowed.enforce(GPU, 6 * GIB, 2500, command=True).kind == NONE


def test_a_container_gets_pytorchs_cap_not_mps(pipes):
    enforcer = ShareEnforcer(str(pipes.parent), log, in_container=True, allow_unenforced=False)
    enforcement = enforcer.enforce(GPU, 8 * GIB, 3334, command=False)
    assert enforcement.kind == FRAMEWORK and "in a container (MPS needs the host's IPC namespace)" in str(
        enforcement.share["line"]
    )


FAKE_CONTROL = """#!/bin/sh
# nvidia-cuda-mps-control as the provider calls it: -d starts a daemon that keeps a pid file in its pipe folder;
# "quit" on stdin ends it. Each call is recorded with the folders it was given.
printf '%s %s %s %s\\n' "$*" "$CUDA_VISIBLE_DEVICES" "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" >> "$CALLS"
if [ "$1" = "-d" ]; then
    sleep 600 &
    echo $! > "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid"
else
    read command && [ "$command" = quit ] && kill "$(cat "$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid")"
fi
"""


def test_the_provider_starts_one_daemon_per_shared_gpu_and_stops_it_after_the_last_share(tmp_path, monkeypatch):
    control = tmp_path / "bin" / "nvidia-cuda-mps-control"
    control.parent.mkdir()
    control.write_text(FAKE_CONTROL)
    control.chmod(stat.S_IRWXU)
    calls = tmp_path / "calls"
    monkeypatch.setenv("PATH", f"{control.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("CALLS", str(calls))
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "no-admin-daemon"))
    state = tmp_path / "state"
    enforcer = ShareEnforcer(str(state), log, in_container=False, allow_unenforced=False)
    allocator = GpuAllocator(state / "locks")
    options = {"policy": "fail", "holder": "t", "requested": "a share", "present": [GPU], "log": log}
    first = allocator.acquire([GPU], 1, share=GpuShare(fraction=0.25), daemon=enforcer.daemon, **options)
    second = allocator.acquire([GPU], 1, share=GpuShare(fraction=0.25), daemon=enforcer.daemon, **options)
    pipe_dir = state / "mps" / GPU.id / "pipe"
    assert calls.read_text().splitlines() == [f"-d {GPU.id} {pipe_dir} {state / 'mps' / GPU.id / 'log'}"]
    request = TaskRequest(ResourceSettings(gpu_count=0.25), ImageSettings(), Envelope.run(["true"]))
    enforcement = shared(enforcer, first, request)
    assert enforcement is not None and enforcement.kind == MPS
    assert enforcement.environment["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe_dir)
    assert enforcement.environment["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=6144M"
    daemon = int((pipe_dir / "nvidia-cuda-mps-control.pid").read_text())
    first.release()
    assert len(calls.read_text().splitlines()) == 1  # a share remains: the daemon stays
    second.release()
    assert calls.read_text().splitlines()[1:] == [f" {GPU.id} {pipe_dir} {state / 'mps' / GPU.id / 'log'}"]  # quit
    deadline = time.monotonic() + 10
    while alive(daemon) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(daemon)
    assert stat.S_IMODE(os.stat(pipe_dir).st_mode) == 0o700  # the pipe and log folders are the worker's own
    assert json.dumps(enforcement.share)  # what the runtime gets in the summary is JSON


def test_a_daemon_that_does_not_start_fails_the_try_and_leaves_no_share_held(tmp_path, monkeypatch):
    control = tmp_path / "bin" / "nvidia-cuda-mps-control"
    control.parent.mkdir()
    control.write_text("#!/bin/sh\necho 'no GPU of that kind' >&2\nexit 1\n")
    control.chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{control.parent}:{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "no-admin-daemon"))
    state = tmp_path / "state"
    enforcer = ShareEnforcer(str(state), log, in_container=False, allow_unenforced=False)
    allocator = GpuAllocator(state / "locks")
    options = {"policy": "fail", "holder": "t", "requested": "a share", "present": [GPU], "log": log}
    with pytest.raises(GpuUnavailableError, match=r"MPS control daemon for GPU GPU-0.* did not start"):
        allocator.acquire([GPU], 1, share=GpuShare(fraction=0.25), daemon=enforcer.daemon, **options)
    from airflow_gpu_provider.host.shares import free_parts

    assert free_parts(allocator.lock_path(GPU)) == 10_000  # nothing promised, nothing held
    allocator.acquire([GPU], 1, **options).release()  # the whole GPU is free
