"""Real DAG runs (dag.test) with backend="docker": XCom, timeouts, on_kill and the demo DAG."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from airflow.utils.net import get_hostname
from backends.docker.docker_fixtures import BASE_IMAGE, container_ids
from backends.docker.user_engines import engines
from helpers import load_dag, run_dag, task_states, xcom

from airflow_gpu_provider import GpuStepOperator, ImageSettings

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaks")]
IMAGE = ImageSettings(parent_image=BASE_IMAGE)
REPO = Path(__file__).resolve().parents[3]
DAG_FILE = REPO / "tests" / "dags" / "docker_dags.py"


@engines("host", "authz", "rootless", "podman")
def test_gpu_task_on_docker_pushes_its_return_value_to_xcom(airflow_home, docker_engine):
    dag_run = run_dag(load_dag(DAG_FILE, "docker_xcom"))
    assert task_states(dag_run) == {"square": "success"}
    value = xcom(dag_run, "square")
    assert value["square"] == 144
    assert value["python"].startswith("3.11")  # the container's Python (Debian bookworm), whatever the worker's
    assert value["run_id"] == dag_run.run_id


def test_execution_timeout_fails_the_task_and_removes_the_container(airflow_home):
    started = time.monotonic()
    dag_run = run_dag(load_dag(DAG_FILE, "docker_timeout"))
    assert task_states(dag_run) == {"sleepy": "failed"}
    assert time.monotonic() - started < 60


def test_on_kill_stops_the_container(docker_client):
    operator = GpuStepOperator(
        task_id="killed",
        command=["python3", "-c", "import time; print('sleeping', flush=True); time.sleep(600)"],
        backend="docker",
        image=IMAGE,
        backend_options={"stop_timeout": 2},
    )
    # what Airflow's ResumableJobMixin reads of the task instance too (its metrics' tags)
    ti = SimpleNamespace(
        dag_id="docker_on_kill", task_id="killed", run_id="manual", try_number=1, map_index=-1, stats_tags={}
    )
    errors: list[BaseException] = []

    def execute() -> None:
        try:
            operator.execute({"ti": ti})
        except BaseException as err:
            errors.append(err)

    before = container_ids(docker_client)
    thread = threading.Thread(target=execute)
    thread.start()
    deadline = time.monotonic() + 30
    while not (container_ids(docker_client) - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    assert container_ids(docker_client) - before
    operator.on_kill()
    thread.join(30)
    assert not thread.is_alive()
    assert errors and "killed" in str(errors[0])


@pytest.mark.slow
def test_demo_dag_trains_in_docker_with_cpu_fallback(airflow_home, torch_image, monkeypatch):
    """The example DAG, unchanged, with backend=docker on a host without the NVIDIA runtime.

    Its train step imports torch, which the Debian base image lacks: the test first builds a derived image
    (base + the CPU torch wheel from /opt/wheels, as an air-gapped wheel dir) and makes it the default parent image
    (the engine's connection's extra ``parent_image``), standing in for the CUDA PyTorch image, not pullable here.
    """
    engine = {"conn_type": "docker", "extra": {"parent_image": torch_image}}
    monkeypatch.setenv("AIRFLOW_CONN_DOCKER_DEFAULT", json.dumps(engine))

    dag_run = run_dag(
        load_dag(REPO / "dags" / "gpu_training_demo.py", "gpu_training_demo"),
        conf={"epochs": 3, "gpu_count": 1, "backend": "docker", "on_missing_gpu": "cpu"},
    )
    assert task_states(dag_run) == {"make_dataset": "success", "train": "success", "report": "success"}
    metrics = xcom(dag_run, "train")
    assert metrics["epochs"] == 3
    assert metrics["device"] == "cpu"
    assert metrics["final_loss"] < metrics["initial_loss"]
    profile = xcom(dag_run, "train", "gpu_profile")  # sampled inside the container, its processes only
    assert profile["kind"] == "cpu" and profile["task"]["backend"] == "docker"
    assert profile["host"] == get_hostname() and profile["node"] != os.uname().nodename  # the worker; the container
    assert profile["cpu_fallback"] is True
    assert profile["devices"][0]["peak_memory"] > 2**20 and profile["samples"] >= 1
