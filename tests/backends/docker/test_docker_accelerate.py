"""AccelerateOperator on the Docker backend: a real 2-process CPU launch inside a container."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import load_dag, run_dag, task_states, xcom

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.usefixtures("no_leaks")]
REPO = Path(__file__).resolve().parents[3]


def test_two_cpu_processes_in_a_container_with_cpu_fallback(airflow_home, torch_image, monkeypatch, no_gpu_runtime):
    """gpu_count=2 on a host without the NVIDIA runtime: the container runs on CPU, and accelerate starts 2 ranks."""
    engine = {"conn_type": "docker", "extra": {"parent_image": torch_image}}  # the engine's default parent image
    monkeypatch.setenv("AIRFLOW_CONN_DOCKER_DEFAULT", json.dumps(engine))

    dag_run = run_dag(load_dag(REPO / "tests" / "dags" / "accelerate_dags.py", "accelerate_docker"))
    assert task_states(dag_run) == {"train": "success"}
    result = xcom(dag_run, "train")
    assert result["world_size"] == 2  # seen by the ranks inside the container
    assert result["ranks"] == [0, 1]
    assert result["backend"] == "gloo"
    assert result["last_loss"] < result["first_loss"]
    assert result["threads"] == [[1, 1], [1, 1]]  # cpu_count=2 shared by the container's 2 ranks
