"""Checkpoints on Docker for real: the worker's folder bind-mounted for every try, resumed, cleaned, and the grace."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from backends.docker.user_engines import engines
from helpers import load_dag, run_dag, task_states, xcom

from airflow_gpu_provider.checkpoint.location import CHECKPOINT_MOUNT, location, run_folder

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("no_leaks", "airflow_home")]
DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "docker_dags.py"


@pytest.fixture(autouse=True)
def allowed_roots(tmp_path, monkeypatch):
    """The deployment allows the test's folder as a checkpoint root (rule F3, policy/checkpoints.py)."""
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_CHECKPOINT_ROOTS", str(tmp_path))


@engines("host", "authz", "rootless")
def test_a_container_resumes_from_the_folder_its_first_try_wrote(tmp_path, docker_engine, request):
    dr = run_dag(load_dag(DAG_FILE, "docker_checkpoint"), conf={"root": str(tmp_path)})
    assert task_states(dr) == {"interrupted": "success", "uninterrupted": "success"}
    resumed, reference = xcom(dr, "interrupted"), xcom(dr, "uninterrupted")
    assert resumed["started_at"] == 3 and reference["started_at"] == 0
    assert resumed["weights"] == reference["weights"]
    rootless = request.node.callspec.params["docker_engine"] == "rootless"  # whose root is the worker's user
    assert resumed["folder"] == CHECKPOINT_MOUNT and resumed["uid"] == (0 if rootless else os.getuid())
    assert (tmp_path / dr.dag_id).is_dir()
    assert not (tmp_path / run_folder(dr.dag_id, dr.run_id)).exists()  # the successful run's, subfolders included


def test_a_timed_out_container_gets_sigterm_and_its_grace_before_it_is_removed(tmp_path):
    started = time.monotonic()
    dr = run_dag(load_dag(DAG_FILE, "docker_checkpoint_grace"), conf={"root": str(tmp_path)})
    assert task_states(dr) == {"last_words": "failed"}
    assert time.monotonic() - started < 60  # not the 300 s sleep
    labels = {"dag_id": dr.dag_id, "run_id": dr.run_id, "task_id": "last_words", "map_index": "-1"}
    # PID 1 of the container ignores a SIGTERM it has no handler for: the runtime's own turned it into SystemExit
    assert Path(location(str(tmp_path), labels).path, "last.txt").read_text() == "saved in finally"
