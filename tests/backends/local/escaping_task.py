"""A worker that runs one real local task whose child escapes every way but the supervisor (the tests' subprocess).

``python escaping_task.py STATE_DIR PID_FILE [--linger] [--reuse-pid]`` runs :func:`leaves_an_escaped_child` as a
local task on the fake GPU ``0`` and prints ``RESULT <json>``. The task's child leaves its process group
(``setpgid``), closes every descriptor it inherited (the GPU locks among them), ignores SIGTERM and ``execve`` s with
an empty environment: neither the task's token nor its group finds it. With ``--linger`` the task process sleeps
beside it (for a test that kills this worker meanwhile). With ``--reuse-pid`` the task is :func:`returns_its_pid`;
once the task process has ended and been reaped, another process takes its pid (``ns_last_pid``: run it in a pid
namespace of its own) and leads a group of that number; ``RESULT`` says whether it survived the end of the task.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path


def leaves_an_escaped_child(pid_file: str, linger: float) -> str:
    import os
    import shutil
    import signal
    import time

    sleep = shutil.which("sleep") or "/bin/sleep"
    child = os.fork()
    if child == 0:  # neither the task's group, nor its descriptors, nor its environment
        os.setpgid(0, 0)
        os.closerange(3, 65536)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stays ignored across execve: SIGKILL it must be
        os.execve(sleep, ["sleep", "300"], {})
    with open(pid_file, "w") as handle:
        handle.write(f"{os.getpid()} {child}")
    time.sleep(linger)  # long enough for its worker to be killed meanwhile, when the test does that
    return "done"


def kills_its_supervisor(pid_file: str) -> str:
    """Start a child that keeps the task's environment (its token) but none of its descriptors, kill the supervisor."""
    import os
    import shutil
    import signal
    import time

    sleep = shutil.which("sleep") or "/bin/sleep"
    child = os.fork()
    if child == 0:
        os.setpgid(0, 0)
        os.closerange(3, 65536)
        os.execv(sleep, ["sleep", "300"])  # the environment stays: the token finds it once the supervisor is gone
    with open(pid_file, "w") as handle:
        handle.write(f"{os.getpid()} {child}")
    time.sleep(0.5)
    os.kill(os.getppid(), signal.SIGKILL)  # the supervisor: the task process dies with it (die_with_parent)
    time.sleep(30)
    return "not reached"


def returns_its_pid(pid_file: str) -> str:
    import os

    with open(pid_file, "w") as handle:
        handle.write(str(os.getpid()))
    return "done"


def run(state_dir: str, pid_file: str, *, linger: float, reuse_pid: bool) -> dict[str, object]:
    from airflow_gpu_provider.backends import BACKENDS
    from airflow_gpu_provider.backends.local.process import TaskProcess
    from airflow_gpu_provider.config.worker import GpuConfig
    from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
    from airflow_gpu_provider.task.callable import shipped_callable
    from airflow_gpu_provider.task.envelope import Envelope
    from airflow_gpu_provider.task.request import TaskRequest

    decoys: list[subprocess.Popen[bytes]] = []
    if reuse_pid:
        wait = TaskProcess.wait

        def wait_then_reuse(self: TaskProcess) -> int:
            status = wait(self)  # the task process has ended and been reaped: its pid is free
            task_pid = int(Path(pid_file).read_text())
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(task_pid - 1))
            decoys.append(subprocess.Popen(["sleep", "60"], start_new_session=True))  # pid and group task_pid
            return status

        TaskProcess.wait = wait_then_reuse  # type: ignore[method-assign]

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    os.environ.update({"AIRFLOW__GPU__STATE_DIR": state_dir, "AIRFLOW__GPU__DEVICES": "0"})  # a host of one GPU
    local = BACKENDS["local"].create({"kill_grace": 2}, logging.getLogger("escaping"))
    function, arguments = (returns_its_pid, [pid_file]) if reuse_pid else (leaves_an_escaped_child, [pid_file, linger])
    envelope = Envelope.call(shipped_callable(function, owner="test"), arguments, {})
    request = TaskRequest(ResourceSettings(gpu_count=1), ImageSettings(), envelope)
    value = local.run(local.plan(request, GpuConfig.read()), {}).return_value
    result: dict[str, object] = {"value": value}
    for decoy in decoys:
        result.update(decoy_pid=decoy.pid, decoy_survived=decoy.poll() is None)
        decoy.kill()
        decoy.wait()
    return result


if __name__ == "__main__":
    arguments = sys.argv[1:]
    reuse = "--reuse-pid" in arguments
    linger = 300.0 if "--linger" in arguments else 0.0
    state, pids = (a for a in arguments if not a.startswith("--"))
    print("RESULT " + json.dumps(run(state, pids, linger=linger, reuse_pid=reuse)), flush=True)
