"""GpuStepOperator on the local backend, through real Airflow (dag.test on SQLite) and real child processes.

The DAGs live in tests/dags/gpu_step_dags.py.
"""

from __future__ import annotations

import datetime
import threading
import time

import pytest
from airflow.sdk import DAG
from conftest import REPO
from helpers import alive, load_dag, run_dag, task_states, xcom

from airflow_gpu_provider import GpuStepOperator, ImageSettings, ResourceSettings
from airflow_gpu_provider.backends.local.backend import LocalBackend
from airflow_gpu_provider.backends.local.options import LocalOptions
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.exceptions import InvalidSettingError, RemoteTaskError, UnknownSettingError
from airflow_gpu_provider.host.allocator import GpuAllocator
from airflow_gpu_provider.host.inventory import Device
from airflow_gpu_provider.pools.placement import ALL_SLOTS_KEY
from airflow_gpu_provider.task.callable import shipped_callable
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.request import TaskRequest

pytestmark = pytest.mark.usefixtures("airflow_home")
DAG_FILE = REPO / "tests" / "dags" / "gpu_step_dags.py"
MODULE_CONSTANT = 1


def add(a, b):
    return a + b


def uses_module_constant():
    return MODULE_CONSTANT


def dag(dag_id: str) -> DAG:
    return load_dag(DAG_FILE, dag_id)


def test_callable_arguments_in_and_return_value_out(capfd):
    dr = run_dag(dag("gpu_step_callable"))
    assert task_states(dr) == {"add": "success"}
    assert xcom(dr, "add") == {"sum": 9}
    out = capfd.readouterr().out
    assert "[gpu] backend=local image=worker python" in out
    assert "[gpu] GPUs assigned: none (running on CPU)" in out


def test_gpus_come_from_the_host_allocator(monkeypatch, state_dir):
    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", "0,1,2")
    dr = run_dag(dag("gpu_step_devices"))
    assert xcom(dr, "two") == {"cuda": "0,1", "omp": "3", "custom": "yes"}
    assert xcom(dr, "none")["cuda"] == ""  # a task without GPUs sees none
    assert GpuAllocator(state_dir / "locks").holder_of(Device("0")) is None  # released


def test_missing_gpus_fail_fast_with_a_clear_message(monkeypatch, state_dir, capfd):
    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", "0")
    dr = run_dag(dag("gpu_step_missing"))
    assert task_states(dr) == {"greedy": "failed"}
    out = capfd.readouterr().out
    assert "Requested 2x nvidia GPU but this host has 1 GPU(s)" in out


def test_templated_resources_and_policy_from_params(monkeypatch, state_dir):
    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", "0,1,2,3")
    templated = dag("gpu_step_templated")
    assert xcom(run_dag(templated), "t")["cuda"] == "0,1,2"
    assert xcom(run_dag(templated, conf={"n": 1}), "t")["cuda"] == "0"
    dr = run_dag(templated, conf={"n": 9, "policy": "cpu"})
    assert task_states(dr) == {"t": "success"}
    assert xcom(dr, "t")["cuda"] == ""


def test_context_values_travel_as_json():
    dr = run_dag(dag("gpu_step_context"))
    assert xcom(dr, "ctx") == {"x": 5, "params": {"lr": 0.1}, "run_id": dr.run_id, "has_date": True}


def test_exception_fails_the_task_with_the_remote_traceback(capfd):
    dr = run_dag(dag("gpu_step_exception"))
    assert task_states(dr) == {"explode": "failed"}
    out = capfd.readouterr().out
    assert 'raise ValueError("boom from the GPU task")' in out
    raise_line = next(i for i, line in enumerate(DAG_FILE.read_text().splitlines(), 1) if "# RAISE_LINE" in line)
    assert f'File "{DAG_FILE}", line {raise_line}, in explode' in out
    assert "The task raised ValueError in the local task process: boom from the GPU task" in out


def test_commands_run_without_a_shell():
    assert task_states(run_dag(dag("gpu_step_command"))) == {"ok": "success", "fails": "failed"}


def test_execution_timeout_kills_the_whole_process_group(tmp_path, monkeypatch, state_dir):
    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", "0")
    pid_file = tmp_path / "pids"
    started = time.monotonic()
    dr = run_dag(dag("gpu_step_timeout"), conf={"pid_file": str(pid_file)})
    assert task_states(dr) == {"hang": "failed"}
    assert time.monotonic() - started < 60
    task_pid, grandchild_pid = map(int, pid_file.read_text().split())
    assert not alive(task_pid)
    assert not alive(grandchild_pid)
    assert GpuAllocator(state_dir / "locks").holder_of(Device("0")) is None


def test_on_kill_stops_the_child_and_releases_gpus(tmp_path, state_dir, monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", "0")
    pid_file = tmp_path / "pids"
    backend = LocalBackend(LocalOptions.parse({"kill_grace": 2}))
    hang = dag("gpu_step_timeout").get_task("hang").python_callable  # the same function as the timeout test's
    envelope = Envelope.call(shipped_callable(hang, owner="t"), [str(pid_file)], {})
    plan = backend.plan(TaskRequest(ResourceSettings(gpu_count=1), ImageSettings(), envelope), GpuConfig.read())
    errors = []
    runner = threading.Thread(target=lambda: errors.append(pytest.raises(RemoteTaskError, backend.run, plan, {})))
    runner.start()
    deadline = time.monotonic() + 30
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    backend.kill()
    runner.join(30)
    assert not runner.is_alive()
    assert "exited with status -15" in str(errors[0].value)
    task_pid, grandchild_pid = map(int, pid_file.read_text().split())
    assert not alive(task_pid)
    assert not alive(grandchild_pid)
    assert GpuAllocator(state_dir / "locks").holder_of(Device("0")) is None


def test_injected_requirements_run_in_a_cached_venv(state_dir):
    assert xcom(run_dag(dag("gpu_step_requirements")), "req") == "ok = true"
    assert len([p for p in (state_dir / "venvs").iterdir() if p.is_dir()]) == 1


def test_gpu_pool_slots_follow_gpu_count(monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU__POOL", "gpu")
    with DAG("gpu_step_pool", schedule=None, start_date=datetime.datetime(2024, 1, 1)):
        two = GpuStepOperator(task_id="two", python_callable=add, op_args=[1, 1], gpu_count=2)
        cpu = GpuStepOperator(task_id="cpu", python_callable=add, op_args=[1, 1])
        own = GpuStepOperator(task_id="own", python_callable=add, op_args=[1, 1], gpu_count=1, pool="mine")
        every = GpuStepOperator(task_id="all", python_callable=add, op_args=[1, 1], gpu_count="all")
    assert (two.pool, two.pool_slots) == ("gpu", 2)
    assert (every.pool, every.pool_slots, every.executor_config) == ("gpu", 1, {ALL_SLOTS_KEY: "all"})
    assert cpu.pool == "default_pool"
    assert own.pool == "mine"


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"python_callable": uses_module_constant}, InvalidSettingError, "'MODULE_CONSTANT' from outside"),
        ({"python_callable": add, "command": ["x"]}, InvalidSettingError, "give exactly one of them"),
        ({}, InvalidSettingError, "give exactly one of them"),
        ({"python_callable": add, "backend": "lsf"}, InvalidSettingError, "backend='lsf' is invalid"),
        ({"python_callable": add, "on_missing_gpu": "skip"}, InvalidSettingError, "'fail' or 'wait' or 'cpu'"),
        ({"python_callable": add, "gpu_count": -1}, InvalidSettingError, "gpu_count=-1"),
        ({"python_callable": add, "memory": "16XB"}, InvalidSettingError, "memory='16XB'"),
        ({"python_callable": add, "requirements": ["numpy>="]}, InvalidSettingError, "PEP 508"),
        ({"python_callable": add, "resources": {"gpu_count": 1}}, InvalidSettingError, "expected a ResourceSettings"),
        # hardening: what used to fail only on the worker, or with a raw error
        ({"command": []}, InvalidSettingError, "an empty command runs nothing"),
        ({"command": "  "}, InvalidSettingError, "an empty command runs nothing"),
        (
            {"python_callable": add, "op_kwargs": {"c": 1}},
            InvalidSettingError,
            "add(c=...) is invalid: no parameter 'c'",
        ),
        (
            {"python_callable": add, "op_args": [1, 2, 3]},
            InvalidSettingError,
            "3 positional arguments for 2 parameters",
        ),
        (
            {"python_callable": add, "op_args": [1]},
            InvalidSettingError,
            "add(a) is invalid: 'b' missing. Accepted: the",
        ),
        ({"command": ["x"], "environment": {"NOT OK": "x"}}, InvalidSettingError, "environment='NOT OK'"),
        ({"command": ["x"], "environment": {"N": 3}}, InvalidSettingError, "environment['N']=3"),
        (
            {"python_callable": add, "backend": "local", "backend_options": {"devices": "0,0"}},
            InvalidSettingError,
            "backend_options['devices']='0,0' is invalid: device ids must be distinct",
        ),
        (
            {"python_callable": add, "backend": "local", "backend_options": {"gpus": 1}},
            UnknownSettingError,
            "backend 'local' does not support the option(s) 'gpus'. These options are supported: devices",
        ),
    ],
)
def test_bad_input_fails_at_dag_parse_time(kwargs, error, fragment):
    with pytest.raises(error) as info, DAG("gpu_step_bad", schedule=None):
        GpuStepOperator(task_id="bad", **kwargs)
    assert fragment in str(info.value)


def test_the_task_sees_the_resources_it_runs_with(monkeypatch, state_dir):
    """AIRFLOW_GPU_RESOURCES: what the task was given, and after a CPU fallback what it really runs with."""
    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", "0")
    dr = run_dag(dag("gpu_step_resources"))
    assert task_states(dr) == {"given": "success", "fallback": "success"}
    assert xcom(dr, "given") == {
        "cpu_count": 2.0,
        "gpu_count": 1,
        "memory": 2**30,
        "accelerator": None,
        "gpu_vendor": "nvidia",
        "mig_profile": None,
        "shm_size": 256 * 2**20,
        "cpu_fallback": False,
    }
    fallback = xcom(dr, "fallback")  # two A100s asked for, one unknown GPU here: on the CPU
    assert (fallback["gpu_count"], fallback["accelerator"], fallback["cpu_fallback"]) == (0, None, True)
