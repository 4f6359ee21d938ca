"""Deferred Docker tasks for real: the container runs while the task is deferred, its trigger runs (in line, as
``dag.test()`` runs triggers), and the task resumes on a worker; a killed worker's container is taken over by the
task instance's next try.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import load_dag, run_dag, task_states, xcom

from airflow_gpu_provider.backends.docker.trigger import DockerContainerTrigger

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaks", "airflow_home")]
TESTS = Path(__file__).resolve().parents[2]
DAG_FILE = TESTS / "dags" / "deferral_dags.py"


def _run(dag_id: str, capfd: pytest.CaptureFixture[str]) -> tuple[object, str]:
    dag_run = run_dag(load_dag(DAG_FILE, dag_id))
    out, err = capfd.readouterr()
    return dag_run, out + err


def test_a_deferred_container_ends_with_its_result_its_output_in_the_log(capfd):
    dag_run, log = _run("deferred_docker_success", capfd)
    assert task_states(dag_run) == {"task": "success"}
    assert xcom(dag_run, "task") == {"question": dag_run.run_id, "answer": 42}
    assert "Deferred: the triggerer watches container" in log
    assert "running trigger in line" in log  # the task was deferred; dag.test() ran its trigger
    assert log.index("Deferred: the triggerer") < log.index("thinking about") < log.index("the answer is ready")


def test_a_deferred_failure_ends_as_a_failure_in_the_worker(capfd):
    dag_run, log = _run("deferred_docker_failure", capfd)
    assert task_states(dag_run) == {"task": "failed"}
    assert "ValueError: the deferred task's own error" in log and "about to fail" in log


def test_a_deferred_oom_kill_is_an_out_of_memory_failure(capfd):
    dag_run, log = _run("deferred_docker_oom", capfd)
    assert task_states(dag_run) == {"task": "failed"}
    assert "ran out of memory (OOM" in log and "memory limit 64.0 MiB" in log


def test_a_deferred_timeout_stops_the_container_and_fails_the_task(capfd):
    started = time.monotonic()
    dag_run, log = _run("deferred_docker_timeout", capfd)
    assert task_states(dag_run) == {"task": "failed"}
    assert time.monotonic() - started < 90  # not the 300 s sleep
    assert "timed out while deferred" in log and "AirflowTaskTimeout" in log


def test_the_trigger_serialises_what_the_triggerer_needs():
    trigger = DockerContainerTrigger("c" * 64, {"docker_url": "unix://var/run/docker.sock"}, 0.5, 1e12)
    path, arguments = trigger.serialize()
    assert path == "airflow_gpu_provider.backends.docker.trigger.DockerContainerTrigger"
    assert json.loads(json.dumps(arguments)) == arguments  # stored as JSON by the triggerer
    assert DockerContainerTrigger(**arguments).serialize() == (path, arguments)


_WORKER = """
import datetime, sys
sys.path.insert(0, {tests!r})
from helpers import load_dag, run_dag, task_states
dag = load_dag({dags!r}, {dag_id!r})
dag_run = run_dag(dag, conf={{"root": {root!r}}}, logical_date=datetime.datetime.fromisoformat({date!r}))
print("STATE", task_states(dag_run)["task"], flush=True)
"""


def _worker(dag_id: str, date: str, root: Path) -> subprocess.Popen[str]:
    code = _WORKER.format(tests=str(TESTS), dags=str(DAG_FILE), dag_id=dag_id, date=date, root=str(root))
    environment = {**os.environ, "AIRFLOW__GPU__ALLOWED_CHECKPOINT_ROOTS": str(root)}
    return subprocess.Popen(
        [sys.executable, "-c", code], env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


@pytest.mark.parametrize("dag_id", ["reattach_docker", "reattach_docker_deferred"])
def test_the_next_try_takes_over_the_container_of_a_killed_worker(dag_id, tmp_path, docker_client):
    root = tmp_path / "root"
    root.mkdir()
    date = datetime.datetime.now(datetime.timezone.utc).isoformat()
    first = _worker(dag_id, date, root)
    deadline = time.monotonic() + 120
    runs = None
    while time.monotonic() < deadline and first.poll() is None:
        runs = next(root.rglob("runs.txt"), None)
        if runs is not None:
            break
        time.sleep(0.2)
    assert runs is not None, "the container never started"
    first.send_signal(signal.SIGKILL)
    first.wait()
    label = f"label=airflow-gpu-provider.dag_id={dag_id}"
    (running,) = [c["Id"] for c in docker_client.containers(filters={"label": label})]  # it outlived its worker

    second = _worker(dag_id, date, root)
    log, _ = second.communicate(timeout=240)
    assert "STATE success" in log, log[-3000:]
    assert f"Reattached to container {running[:12]}, left running" in log
    assert "done after 1 run(s)" in log  # one container ran the function: the next try started none
    assert runs.read_text().count("\n") == 1
    assert not docker_client.containers(all=True, filters={"label": label})  # removed once collected
