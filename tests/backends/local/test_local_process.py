"""The local task's process tree on its failure paths: what it leaves running, how it is stopped, what it prints."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time

import pytest
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


@pytest.fixture(autouse=True)
def one_gpu_host(tmp_path, monkeypatch):
    """A host of one (listed) GPU, with a state dir of its own."""
    monkeypatch.setenv("AIRFLOW__GPU__STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", "0")


def backend(**options):
    return BACKENDS["local"].create({"kill_grace": 2, **options}, logging.getLogger("test.local"))


def request(function, *args, gpus=1):
    envelope = Envelope.call(shipped_callable(function, owner="test"), list(args), {})
    return TaskRequest(ResourceSettings(gpu_count=gpus), ImageSettings(), envelope)


def leaves_a_background_child(pid_file: str) -> str:
    import subprocess

    child = subprocess.Popen(["sleep", "300"])  # inherits stdout: the pipe stays open after the task returns
    with open(pid_file, "w") as handle:
        handle.write(str(child.pid))
    return "done"


def starts_a_setsid_grandchild(pid_file: str) -> str:
    import subprocess
    import time

    child = subprocess.Popen(["sleep", "300"], start_new_session=True, stdout=subprocess.DEVNULL)  # setsid()
    with open(pid_file, "w") as handle:
        handle.write(str(child.pid))
    time.sleep(300)
    return "never"


def prints_a_huge_line_and_progress() -> int:
    import sys
    import time

    sys.stdout.write("x" * 3_000_000)  # one line, never ended
    sys.stdout.write("\n")
    for percent in range(0, 101, 25):
        sys.stdout.write(f"\r{percent:3d}%|{'#' * (percent // 10)}")
        sys.stdout.flush()
        time.sleep(0.4)
    sys.stdout.write("\n")
    return 1


def sleeps() -> None:
    import time

    time.sleep(300)


def test_a_background_child_neither_hangs_the_task_nor_outlives_it(tmp_path):
    pid_file = tmp_path / "pid"
    started = time.monotonic()
    local = backend()
    result = local.run(local.plan(request(leaves_a_background_child, str(pid_file)), GpuConfig.read()), {})
    assert result.return_value == "done"
    assert time.monotonic() - started < 60  # used to wait for the end of the output: execution_timeout
    assert not alive(int(pid_file.read_text()))
    assert GpuAllocator(tmp_path / "state" / "locks").holder_of(Device("0")) is None


def test_a_setsid_grandchild_is_stopped_with_the_task_before_its_gpu_is_free(tmp_path):
    pid_file = tmp_path / "pid"
    local = backend()
    plan = local.plan(request(starts_a_setsid_grandchild, str(pid_file)), GpuConfig.read())
    errors: list[BaseException] = []
    runner = threading.Thread(target=lambda: errors.append(pytest.raises(RemoteTaskError, local.run, plan, {}).value))
    runner.start()
    deadline = time.monotonic() + 30
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    grandchild = int(pid_file.read_text())
    assert os.getpgid(grandchild) != os.getpgid(os.getpid())  # out of every process group the task had
    local.kill()
    runner.join(60)
    assert not runner.is_alive()
    assert not alive(grandchild)
    assert GpuAllocator(tmp_path / "state" / "locks").holder_of(Device("0")) is None


def test_on_kill_from_a_signal_handler_stops_the_task_cleanly(tmp_path):
    """Airflow calls on_kill from its SIGTERM handler, in the thread that is streaming the task's output."""
    local = backend()
    plan = local.plan(request(sleeps), GpuConfig.read())
    previous = signal.signal(signal.SIGUSR1, lambda *_: local.kill())
    try:
        threading.Timer(1.5, os.kill, args=(os.getpid(), signal.SIGUSR1)).start()
        started = time.monotonic()
        with pytest.raises(RemoteTaskError, match="exited with status -15"):  # not "reentrant call inside ..."
            local.run(plan, {})
        assert time.monotonic() - started < 30
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert GpuAllocator(tmp_path / "state" / "locks").holder_of(Device("0")) is None


def test_huge_lines_are_logged_in_pieces_and_progress_bars_stream(tmp_path, caplog):
    local = backend()
    with caplog.at_level(logging.INFO, logger="test.local"):
        assert (
            local.run(local.plan(request(prints_a_huge_line_and_progress, gpus=0), GpuConfig.read()), {}).return_value
            == 1
        )
    lines = [r.getMessage() for r in caplog.records if r.name == "test.local"]
    assert max(len(line) for line in lines) <= 8192  # never 3 MB held and logged whole
    assert sum(line.count("x") for line in lines) == 3_000_000
    progress = [line for line in lines if line.endswith("%|") or "%|#" in line]
    assert len(progress) >= 3  # "\r" updates reach the log while the bar runs, not only at its end
    assert progress[-1].startswith("100%")


def test_what_a_killed_worker_left_is_cleaned_by_the_next_task(tmp_path):
    state = tmp_path / "state"
    stale = state / "tasks" / f"task-{socket.gethostname()}:999999999:12345-gone"  # a worker that does not exist
    # A worker of another container sharing the state dir: its pid is not in this pid namespace, but it lives.
    other = state / "tasks" / "task-another-container:4242:777-live"
    for folder in (stale, other):
        folder.mkdir(parents=True)
        (folder / "envelope.json").write_text("{}")
    state.chmod(0o700)
    (state / "tasks").chmod(0o700)
    local = backend()
    assert local.run(local.plan(request(returns_one, gpus=0), GpuConfig.read()), {}).return_value == 1
    assert list((state / "tasks").iterdir()) == [other]


def returns_one() -> int:
    return 1


def test_a_dead_workers_task_process_is_stopped_by_the_next_task_which_finds_its_folder(tmp_path, caplog):
    """A worker killed mid-task leaves its task folder: the next task looks for its processes (and only then: the scan
    of every process's environment is skipped on a host where no worker died)."""
    import subprocess

    from airflow_gpu_provider.backends.local.process import TOKEN_VARIABLE

    dead = f"{socket.gethostname()}:999999999:12345"
    folder = tmp_path / "state" / "tasks" / f"task-{dead}-left"
    folder.mkdir(parents=True)
    (tmp_path / "state").chmod(0o700)
    (tmp_path / "state" / "tasks").chmod(0o700)
    orphan = subprocess.Popen(["sleep", "600"], env={**os.environ, TOKEN_VARIABLE: f"{dead}/token"})
    try:
        local = backend()
        with caplog.at_level(logging.WARNING):
            assert local.run(local.plan(request(returns_one, gpus=0), GpuConfig.read()), {}).return_value == 1
        assert orphan.wait(timeout=30) == -signal.SIGTERM
        assert f"Stopping processes [{orphan.pid}], left running by a worker that died" in caplog.text
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()
    assert not folder.exists()
