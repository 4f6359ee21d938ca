"""DockerBackend on a real engine: results, logs, failures and cleanup (containers counted before and after)."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from pathlib import Path

import pytest
from backends.docker.docker_fixtures import BASE_IMAGE, container_ids
from backends.docker.user_engines import engines

from airflow_gpu_provider.backends.docker.backend import ContainerOomError, DockerBackend
from airflow_gpu_provider.backends.docker.images.engine import ImageError
from airflow_gpu_provider.backends.docker.options import DockerOptions
from airflow_gpu_provider.backends.docker.plan import RESULT_LABEL, RESULT_ON_OUTPUT
from airflow_gpu_provider.checkpoint.location import CheckpointLocation
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.exceptions import GpuTaskError, GpuUnavailableError, RemoteTaskError
from airflow_gpu_provider.host.workers import worker_identity
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.callable import shipped_callable
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.request import TaskRequest

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaks")]
LABELS = {"dag_id": "docker_tests", "task_id": "t", "run_id": "r", "try_number": "1", "map_index": "-1"}


def request(envelope, *, image=None, on_missing_gpu="fail", **resources) -> TaskRequest:
    return TaskRequest(
        ResourceSettings(**resources), image or ImageSettings(parent_image=BASE_IMAGE), envelope, on_missing_gpu, LABELS
    )


def call(function, *args, **kwargs):
    return Envelope.call(shipped_callable(function, owner="test"), list(args), kwargs)


def run(task_log, req, options=None):
    backend = DockerBackend(DockerOptions.parse(options or {}), log=task_log[0])
    return backend.run(backend.plan(req, GpuConfig.read()), {})


def add(a: int, b: int = 1) -> dict:
    import os

    print("adding inside the container", flush=True)
    return {"sum": a + b, "user": os.getuid(), "visible": os.environ.get("NVIDIA_VISIBLE_DEVICES")}


def fail_with_value_error() -> None:
    raise ValueError("boom from the container")


@engines("host", "rootless")  # the engine of the worker's own user too (user_engines.py)
def test_callable_gets_arguments_and_returns_its_value(task_log, docker_engine):
    result = run(task_log, request(call(add, 2, b=5), cpu_count=1, memory="256Mi"))
    assert result.return_value == {"sum": 7, "user": 0, "visible": "void"}
    text = task_log[1].text
    assert "adding inside the container" in text
    assert f"[gpu] backend=docker image={BASE_IMAGE} requirements=none" in text
    assert "[gpu] GPUs assigned: none (running on CPU)" in text
    assert "[gpu] CUDA cache before task: skipped" in text


@engines("host", "rootless")
def test_command_runs_through_the_runtime(task_log, docker_engine):
    result = run(task_log, request(Envelope.run(["python3", "-c", "print('hello from a command')"])))
    assert result.return_value is None  # a command's exit status 0: no error raised
    assert "hello from a command" in task_log[1].text
    assert "[gpu] resources: no GPU" in task_log[1].text


def test_non_zero_exit_fails_the_task(task_log):
    with pytest.raises(RemoteTaskError, match="exited with status 3"):
        run(task_log, request(Envelope.run(["python3", "-c", "import sys; sys.exit(3)"])))


def test_exception_fails_with_the_containers_traceback(task_log):
    with pytest.raises(RemoteTaskError, match=r"ValueError.*boom from the container") as excinfo:
        run(task_log, request(call(fail_with_value_error)))
    assert excinfo.value.error_type == "ValueError"
    traceback = excinfo.value.remote_traceback  # the operator logs it once, at ERROR
    assert traceback.startswith("Traceback (most recent call last)")
    assert f'File "{__file__}"' in traceback  # the traceback names this file and its line numbers
    assert "ValueError: boom from the container" in traceback
    text = task_log[1].text
    assert "[gpu] the task raised ValueError: boom from the container" in text  # the container's one line
    assert "Traceback" not in text  # not a second time


def test_a_commands_traceback_is_one_error_record(task_log):
    script = "def load():\n    raise KeyError('no such column')\n\nload()\n"
    with pytest.raises(RemoteTaskError, match="exited with status 1"):
        run(task_log, request(Envelope.run(["python3", "-c", script])))
    errors = [r.getMessage() for r in task_log[1].records if r.levelno == logging.ERROR]
    assert len(errors) == 1, task_log[1].text
    assert errors[0].startswith("Traceback (most recent call last):")
    assert 'File "<string>", line 2, in load' in errors[0] and errors[0].endswith("KeyError: 'no such column'")


def allocate(megabytes: int) -> int:
    blocks = [bytearray(1024 * 1024) for _ in range(megabytes)]
    return len(blocks)


def test_oom_kill_is_reported_as_oom(task_log):
    with pytest.raises(ContainerOomError, match=r"ran out of memory \(OOM.*memory limit 48.0 MiB"):
        run(task_log, request(call(allocate, 512), memory="48Mi"))


def test_gpu_request_without_nvidia_runtime_is_a_clear_error(task_log, no_gpu_runtime):
    with pytest.raises(GpuUnavailableError, match="NVIDIA Container Toolkit") as excinfo:
        run(task_log, request(call(add, 1), gpu_count=1))
    assert 'could not select device driver "" with capabilities: [[gpu]]' in str(excinfo.value)
    assert "on_missing_gpu='cpu'" in str(excinfo.value)


def test_gpu_request_without_nvidia_runtime_falls_back_to_cpu(task_log, no_gpu_runtime):
    result = run(task_log, request(call(add, 1), gpu_count=2, on_missing_gpu="cpu"))
    assert result.return_value["sum"] == 2
    assert result.return_value["visible"] == "void"
    text = task_log[1].text
    assert "cannot start GPU containers" in text and "running on CPU instead" in text
    assert "looks CPU-only" in text  # the base image has no CUDA
    assert "[gpu] resources: 2x nvidia GPU -> CPU fallback" in text


def test_gpu_request_reaches_the_engine_as_device_requests(docker_client, task_log):
    """GPU containers cannot start here, so create one from the plan and inspect it."""
    backend = DockerBackend(DockerOptions.parse({"devices": ["GPU-1111", "GPU-2222"]}), log=task_log[0])
    cases = {
        "count": (DockerBackend(DockerOptions()), {"gpu_count": 2}, {"Count": 2, "DeviceIDs": None}),
        "all": (DockerBackend(DockerOptions()), {"gpu_count": "all"}, {"Count": -1, "DeviceIDs": None}),
        "ids": (backend, {"gpu_count": 1}, {"Count": 0, "DeviceIDs": ["GPU-1111"]}),
    }
    for name, (owner, resources, expected) in cases.items():
        plan = owner.plan(request(Envelope.run(["true"]), cpu_count=2, memory="1Gi", **resources), GpuConfig.read())
        kwargs = plan.create_kwargs(BASE_IMAGE)
        host_config = docker_client.create_host_config(**kwargs.pop("host_config"))
        container = docker_client.create_container(host_config=host_config, **kwargs)
        try:
            inspected = docker_client.inspect_container(container["Id"])["HostConfig"]
        finally:
            docker_client.remove_container(container["Id"], force=True)
        (device_request,) = inspected["DeviceRequests"]
        assert device_request["Capabilities"] == [["gpu"]], name
        assert device_request["Count"] == expected["Count"], name
        assert (device_request["DeviceIDs"] or None) == expected["DeviceIDs"], name
        assert {u["Name"]: u["Soft"] for u in inspected["Ulimits"]} == {"memlock": -1, "stack": 67108864}
        assert inspected["NanoCpus"] == 2_000_000_000
        assert inspected["Memory"] == 1024**3
        assert inspected["ShmSize"] == 1024**3  # the 8 GiB default, capped at the memory limit
        assert inspected["Privileged"] is False
        assert not any(
            "docker.sock" in str(m) for m in (inspected.get("Binds") or []) + (inspected.get("Mounts") or [])
        )


def test_bad_image_name_is_a_clear_error(task_log):
    image = ImageSettings(parent_image="airflow-gpu-test/no-such-image:nope")
    with pytest.raises(
        ImageError, match="'airflow-gpu-test/no-such-image:nope' is not on the engine and cannot be pulled"
    ):
        run(task_log, request(Envelope.run(["true"]), image=image))


def test_unreachable_daemon_is_a_clear_error(task_log, tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_CLUSTERS", f"docker=unix://{tmp_path}/nothing.sock")
    started = time.monotonic()
    with pytest.raises(GpuTaskError, match=r"Cannot reach the Docker engine at unix://.*nothing\.sock"):
        run(task_log, request(Envelope.run(["true"])), {"docker_url": f"unix://{tmp_path}/nothing.sock"})
    assert time.monotonic() - started < 10


def test_image_without_python_is_a_clear_error(docker_client, task_log, tmp_path):
    import io
    import tarfile

    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        data = b"FROM scratch\nLABEL airflow-gpu-test=no-python\n"
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    tag = "airflow-gpu-test-derived:no-python"
    list(docker_client.build(fileobj=context, custom_context=True, tag=tag, rm=True, forcerm=True, decode=True))
    with pytest.raises(GpuTaskError, match="needs python3"):
        run(task_log, request(Envelope.run(["true"]), image=ImageSettings(parent_image=tag)))


def sleep_forever() -> None:
    import time

    print("sleeping", flush=True)
    time.sleep(600)


@engines("host", "rootless")
def test_kill_stops_and_removes_the_container(docker_engine, task_log):
    backend = DockerBackend(DockerOptions.parse({"stop_timeout": 2}), log=task_log[0])
    plan = backend.plan(request(call(sleep_forever)), GpuConfig.read())
    outcome: dict[str, BaseException] = {}

    def target() -> None:
        try:
            backend.run(plan, {})
        except BaseException as err:
            outcome["error"] = err

    before = container_ids(docker_engine)
    thread = threading.Thread(target=target)
    thread.start()
    deadline = time.monotonic() + 30
    while task_log[1].count("sleeping") == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(container_ids(docker_engine) - before) == 1  # it is running
    started = time.monotonic()
    backend.kill()
    thread.join(30)
    assert not thread.is_alive()
    assert time.monotonic() - started < 15
    assert isinstance(outcome["error"], GpuTaskError)
    assert "killed" in str(outcome["error"])


def whoami_and_read(path: str) -> dict:
    import os

    with open(path) as handle:
        return {"uid": os.getuid(), "data": handle.read()}


def test_user_and_read_only_mount(task_log, tmp_path: Path, monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW__GPU_POLICY__ALLOWED_USERS", "1000:1000"
    )  # the deployment allows them (policy/docker.py)
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_MOUNT_ROOTS", f"{tmp_path}:ro")
    (tmp_path / "data.txt").write_text("mounted data")
    tmp_path.chmod(0o755)
    options = {"user": "1000:1000", "mounts": [{"source": str(tmp_path), "target": "/data", "read_only": True}]}
    result = run(task_log, request(call(whoami_and_read, "/data/data.txt")), options)
    assert result.return_value == {"uid": 1000, "data": "mounted data"}


def test_auto_remove_success_keeps_a_failed_container_stopped(docker_client, task_log):
    before = container_ids(docker_client)
    with pytest.raises(RemoteTaskError):
        run(task_log, request(Envelope.run(["false"])), {"auto_remove": "success"})
    (kept,) = container_ids(docker_client) - before
    try:
        assert docker_client.inspect_container(kept)["State"]["Running"] is False
        assert "Kept container" in task_log[1].text
    finally:
        docker_client.remove_container(kept, force=True)


def test_files_through_the_docker_api_when_not_mounted(task_log, state_dir, monkeypatch):
    """mount_tmp_dir=False (remote engines): runtime and envelope are copied in, the result copied out."""
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_USERS", "1000:1000")
    options = {"mount_tmp_dir": False, "user": "1000:1000"}
    assert run(task_log, request(call(add, 20, b=22)), options).return_value["sum"] == 42
    with pytest.raises(RemoteTaskError, match="boom from the container"):
        run(task_log, request(call(fail_with_value_error)), options)
    assert list((state_dir / "docker-tasks").iterdir()) == []  # the worker folders are gone too


def test_no_upload_into_a_container_with_a_writable_host_folder(task_log, state_dir, monkeypatch, tmp_path):
    """Issue 34, H1: the engine unpacks an upload as root into the container's mounts too. Files that cannot be
    bound read-only (mount_tmp_dir=False) are never uploaded into a container with a writable checkpoint folder."""
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_CHECKPOINT_ROOTS", str(tmp_path))
    task = dataclasses.replace(request(call(add, 1, b=2)), checkpoint=CheckpointLocation(str(tmp_path), "d/r/t"))
    with pytest.raises(GpuTaskError, match=r"cannot be copied into a container that may write .*checkpoint"):
        run(task_log, task, {"mount_tmp_dir": False})
    assert list((state_dir / "docker-tasks").iterdir()) == []


def test_a_lasting_containers_files_go_with_it_or_once_its_worker_is_gone(state_dir):
    """A deferred or durable container keeps its read-only files folder (``lasting-*``); the sweep removes one only
    when its worker is gone and no container mounts it."""
    from airflow_gpu_provider.backends.docker.files import sweep

    tasks = state_dir / "docker-tasks"
    import socket

    dead = f"{socket.gethostname()}:1:0"  # this host's pid 1, which did not start at tick 0: a worker gone
    for name in (f"lasting-{dead}-gone", f"lasting-{dead}-mounted", f"lasting-{worker_identity()}-mine"):
        (tasks / name).mkdir(parents=True)
    sweep([{"Mounts": [{"Source": str(tasks / f"lasting-{dead}-mounted")}]}], str(state_dir))
    assert {p.name for p in tasks.iterdir()} == {f"lasting-{dead}-mounted", f"lasting-{worker_identity()}-mine"}


def test_worker_folder_is_private_read_only_and_removed(task_log, state_dir):
    """... and the runtime in it was compiled by the worker's Python: an image of the same version imports it so."""
    import sys

    result = run(task_log, request(call(probe_the_task_folder)))
    runtime = result.return_value.pop("runtime")
    assert result.return_value == {"write": "refused", "inputs": ["envelope.json", "runtime.pyz"]}
    same_python = tuple(runtime["python"]) == sys.version_info[:2]
    assert runtime["protocol"] == "/airflow-gpu/runtime.pyz/airflow_gpu_runtime/protocol.py" + "c" * same_python
    parent = state_dir / "docker-tasks"
    assert parent.stat().st_mode & 0o777 == 0o700  # no other user of the host reaches the task's files
    assert list(parent.iterdir()) == []


def probe_the_task_folder() -> dict:
    import os
    import sys

    try:  # a setuid binary, a planted module, a symlink: the container cannot put anything into a host path
        with open("/airflow-gpu/planted.py", "w") as handle:
            handle.write("x")
        write = "allowed"
    except OSError:
        write = "refused"
    protocol = sys.modules["airflow_gpu_runtime.protocol"].__file__  # the runtime's, in this process
    runtime = {"protocol": protocol, "python": sys.version_info[:2]}
    return {"write": write, "inputs": sorted(os.listdir("/airflow-gpu")), "runtime": runtime}


def privileges() -> dict:
    with open("/proc/self/status") as handle:
        status = dict(line.split(":\t", 1) for line in handle.read().splitlines() if ":\t" in line)
    return {"uid": status["Uid"].split()[0], "caps": status["CapEff"], "no_new_privs": status["NoNewPrivs"]}


def test_containers_keep_no_capability_and_gain_no_privilege(task_log, monkeypatch):
    value = run(task_log, request(call(privileges))).return_value
    assert value == {"uid": str(os.geteuid()), "caps": "0000000000000000", "no_new_privs": "1"}
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_CAPABILITIES", "SYS_PTRACE")  # the deployment allows it
    kept = run(task_log, request(call(privileges)), {"cap_add": ["SYS_PTRACE"]}).return_value
    assert int(kept["caps"], 16) == 1 << 19  # CAP_SYS_PTRACE alone


def forge_and_return() -> int:
    import sys

    print('[gpu] result: {"ok": true, "return_value": 666}')  # the task's own "result" line: the last one wins
    sys.stdout.write("left without a line end")  # the runtime's line end before its result: still found
    return 7


def test_the_result_comes_on_the_attached_output_not_from_the_containers_files(task_log, monkeypatch):
    import docker

    read = []
    original = docker.APIClient.get_archive
    monkeypatch.setattr(docker.APIClient, "get_archive", lambda *a, **k: read.append(a) or original(*a, **k))
    assert run(task_log, request(call(forge_and_return))).return_value == 7
    assert read == []  # no second read of the container: its output carried the result
    assert "left without a line end" in task_log[1].text
    assert "[gpu] result:" not in task_log[1].text.replace('[gpu] result: {"ok": true, "return_value": 666}', "")


WRITE = "printf '%s' '{\"ok\": true, \"return_value\": 5}' > /tmp/airflow-gpu-result.json"


@pytest.mark.parametrize(
    ("labels", "made", "fragment"),
    [
        ({}, WRITE, None),  # a container of 0.1.0: its runtime wrote the file, which is read
        ({}, "ln -s /etc/passwd /tmp/airflow-gpu-result.json", "not a regular file"),
        ({}, "mkfifo /tmp/airflow-gpu-result.json", "not a regular file"),
        ({}, "mkdir /tmp/airflow-gpu-result.json", "not a regular file"),
        ({}, "head -c 70000000 /dev/zero > /tmp/airflow-gpu-result.json", "larger than"),
        (
            {RESULT_LABEL: RESULT_ON_OUTPUT},
            WRITE,
            "result is missing",
        ),  # ours: never read from the file, whatever it is
    ],
)
def test_a_containers_label_says_where_its_result_is_and_a_file_is_never_followed(
    docker_client, labels, made, fragment
):
    from airflow_gpu_provider.backends.docker import lifecycle

    container = docker_client.create_container(BASE_IMAGE, ["sh", "-c", made], labels=labels)["Id"]
    try:
        docker_client.start(container)
        if fragment is None:
            assert lifecycle.collect(docker_client, container, None, None).return_value == 5
        else:
            with pytest.raises(GpuTaskError, match=fragment):
                lifecycle.collect(docker_client, container, None, None)
    finally:
        docker_client.remove_container(container, force=True)


def test_the_providers_device_isolation_wins_over_the_tasks_environment(task_log):
    image = ImageSettings(
        parent_image=BASE_IMAGE, environment={"NVIDIA_VISIBLE_DEVICES": "all", "OMP_NUM_THREADS": "3"}
    )
    value = run(task_log, request(call(add, 1), image=image, cpu_count=1)).return_value
    assert value["visible"] == "void"  # a CPU task never sees the host's GPUs


WORKER = """
import logging, sys
from airflow_gpu_provider.backends import BACKENDS
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.request import TaskRequest
from airflow_gpu_provider.config.worker import GpuConfig
logging.basicConfig(level=logging.INFO, stream=sys.stdout)
backend = BACKENDS["docker"].create({}, logging.getLogger("worker"))
request = TaskRequest(ResourceSettings(), ImageSettings(parent_image=sys.argv[2]), Envelope.run(["sleep", "300"]))
backend.run(backend.plan(request, GpuConfig.read()), {})
"""


def test_a_container_whose_worker_was_killed_is_reaped_before_the_next_task(docker_client, task_log, state_dir):
    import signal
    import subprocess
    import sys

    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, "", BASE_IMAGE], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    label = {"label": "airflow-gpu-provider.worker"}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        running = [
            c for c in docker_client.containers(filters=label) if f":{worker.pid}:" in c["Labels"][label["label"]]
        ]
        if running:
            break
        time.sleep(0.2)
    assert running, worker.stdout.read1().decode() if worker.stdout else ""
    worker.send_signal(signal.SIGKILL)  # no chance to clean up: the container keeps running, its folder stays
    worker.wait()
    assert docker_client.inspect_container(running[0]["Id"])["State"]["Running"]
    assert list((state_dir / "docker-tasks").iterdir())

    assert run(task_log, request(call(add, 1))).return_value["sum"] == 2
    assert not [c for c in docker_client.containers(all=True, filters=label) if c["Id"] == running[0]["Id"]]
    assert "left running by a worker that died" in task_log[1].text
    assert list((state_dir / "docker-tasks").iterdir()) == []  # the killed worker's task folder too
