"""A local task's processes are found whatever they do, and its GPU stays locked while any of them lives.

The task's child in these tests leaves its process group, closes the descriptors it inherited (the GPU locks) and
clears its environment (``escaping_task.py``): only the supervisor, the subreaper of the task's tree, still knows it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from backends.local.escaping_task import kills_its_supervisor, leaves_an_escaped_child
from helpers import alive

from airflow_gpu_provider.backends import BACKENDS
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.exceptions import RemoteTaskError
from airflow_gpu_provider.host.allocator import GpuAllocator
from airflow_gpu_provider.host.inventory import Device
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.callable import shipped_callable
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.request import TaskRequest

SCRIPT = Path(__file__).with_name("escaping_task.py")


class LockWatch:
    """Samples the GPU lock and the escaped child until stopped: was the lock ever free while the child lived?"""

    def __init__(self, state: Path, pid_file: Path) -> None:
        self.allocator, self.pid_file = GpuAllocator(state / "locks"), pid_file
        self.child = 0
        self.freed_while_alive: list[float] = []
        self.escaped: list[tuple[int, bytes]] = []  # the child's group and environment, seen while it ran
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.is_set():
            if not self.child and self.pid_file.exists() and len(self.pid_file.read_text().split()) == 2:
                self.child = int(self.pid_file.read_text().split()[1])
            if self.child:
                free = self.allocator.holder_of(Device("0")) is None  # first the lock, then the child: if it
                if alive(self.child):  # lives now, it lived when the lock was seen free
                    if free:
                        self.freed_while_alive.append(time.monotonic())
                    if not self.escaped and self._has_exec(self.child):  # before execve it is the task's copy
                        environ = Path(f"/proc/{self.child}/environ").read_bytes()
                        self.escaped.append((os.getpgid(self.child), environ))
            time.sleep(0.02)

    @staticmethod
    def _has_exec(pid: int) -> bool:
        """Has the forked child become ``sleep`` yet (until then it holds the task's environment)?"""
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep\0")
        except OSError:
            return False

    def stop(self) -> None:
        self._done.set()
        self._thread.join(10)


def test_a_child_out_of_its_group_with_no_environment_is_stopped_before_its_gpu_is_free(tmp_path, monkeypatch):
    state, pid_file = tmp_path / "state", tmp_path / "pids"
    monkeypatch.setenv("AIRFLOW__GPU__STATE_DIR", str(state))
    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", "0")
    local = BACKENDS["local"].create({"kill_grace": 2}, logging.getLogger("test.local"))
    envelope = Envelope.call(shipped_callable(leaves_an_escaped_child, owner="test"), [str(pid_file), 0.5], {})
    plan = local.plan(TaskRequest(ResourceSettings(gpu_count=1), ImageSettings(), envelope), GpuConfig.read())
    watch = LockWatch(state, pid_file)
    try:
        assert local.run(plan, {}).return_value == "done"
    finally:
        watch.stop()
    task_pid, child = map(int, pid_file.read_text().split())
    assert watch.escaped and watch.escaped[0][0] not in (task_pid, os.getpgid(0))
    assert watch.escaped[0][1] == b""  # nothing of the task's environment, its token included
    assert not alive(child)  # it ignored SIGTERM: SIGKILL after the grace period
    assert watch.freed_while_alive == []
    assert GpuAllocator(state / "locks").holder_of(Device("0")) is None


def test_what_outlives_a_supervisor_the_task_killed_is_stopped_before_its_gpu_is_free(tmp_path, monkeypatch):
    """The supervisor killed, its tree is no longer beneath it: the worker finds what is left by its token."""
    state, pid_file = tmp_path / "state", tmp_path / "pids"
    monkeypatch.setenv("AIRFLOW__GPU__STATE_DIR", str(state))
    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", "0")
    local = BACKENDS["local"].create({"kill_grace": 2}, logging.getLogger("test.local"))
    envelope = Envelope.call(shipped_callable(kills_its_supervisor, owner="test"), [str(pid_file)], {})
    plan = local.plan(TaskRequest(ResourceSettings(gpu_count=1), ImageSettings(), envelope), GpuConfig.read())
    watch = LockWatch(state, pid_file)
    try:
        with pytest.raises(RemoteTaskError, match="exited with status -9"):
            local.run(plan, {})
    finally:
        watch.stop()
    _, child = map(int, pid_file.read_text().split())
    assert watch.escaped and b"AIRFLOW_GPU_TASK=" in watch.escaped[0][1]  # it ran with the task's token
    assert not alive(child)
    assert watch.freed_while_alive == []
    assert GpuAllocator(state / "locks").holder_of(Device("0")) is None


def test_the_task_of_a_killed_worker_is_stopped_at_once_and_its_gpu_freed_after(tmp_path):
    """Nobody runs another task: the supervisor sees its worker die, and stops the tree itself."""
    state, pid_file = tmp_path / "state", tmp_path / "pids"
    worker = subprocess.Popen(
        [sys.executable, str(SCRIPT), str(state), str(pid_file), "--linger"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    watch = LockWatch(state, pid_file)
    try:
        deadline = time.monotonic() + 60
        while not watch.escaped and time.monotonic() < deadline and worker.poll() is None:
            time.sleep(0.05)
        assert watch.escaped, "the task's child never started"
        worker.send_signal(signal.SIGKILL)  # not reaped until the end: a zombie worker is a dead one
        task_pid, child = map(int, pid_file.read_text().split())
        deadline = time.monotonic() + 30
        while (alive(child) or alive(task_pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(task_pid) and not alive(child)
        deadline = time.monotonic() + 10
        while GpuAllocator(state / "locks").holder_of(Device("0")) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert GpuAllocator(state / "locks").holder_of(Device("0")) is None
    finally:
        watch.stop()
        worker.kill()
        worker.wait()
    assert watch.freed_while_alive == []


def _pid_namespace() -> list[str]:
    """``unshare`` into a pid namespace of our own (pids from 1, ``ns_last_pid`` ours to set), or skip."""
    argv = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) to make a pid namespace")
    probe = subprocess.run([*argv, "sh", "-c", "echo 100 > /proc/sys/kernel/ns_last_pid"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a pid namespace here: {probe.stderr.decode().strip()}")
    return argv


def test_a_reused_pid_is_never_signalled_after_the_task(tmp_path):
    """Once the task process is reaped, a new process with its pid, leading a group of that number, is left alone."""
    done = subprocess.run(
        [
            *_pid_namespace(),
            sys.executable,
            str(SCRIPT),
            str(tmp_path / "state"),
            str(tmp_path / "pids"),
            "--reuse-pid",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout + done.stderr
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["value"] == "done"
    assert result["decoy_pid"] == int((tmp_path / "pids").read_text())
    assert result["decoy_survived"], done.stderr[-3000:]
