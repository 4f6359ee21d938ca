"""Profiles of real Docker runs: the worker's host name (not the container's id), the host's CPU pressure as the
container reads it, and a CPU fallback on an engine without the NVIDIA runtime. DAGs: tests/dags/telemetry_dags.py.
"""

from __future__ import annotations

import pytest
from airflow.utils.net import get_hostname
from conftest import REPO
from helpers import load_dag, run_dag, task_states, xcom

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("airflow_home", "no_leaks")]
DAG_FILE = REPO / "tests" / "dags" / "telemetry_dags.py"


def test_a_docker_profile_names_the_worker_and_the_container(monkeypatch, gpu_runtime_problem):
    monkeypatch.setenv("AIRFLOW__GPU__PROFILE_INTERVAL", "0.25")  # the floor
    dag_run = run_dag(load_dag(DAG_FILE, "telemetry_docker"))
    assert task_states(dag_run) == {"plain": "success", "fallback": "success"}
    plain, fallback = xcom(dag_run, "plain", "gpu_profile"), xcom(dag_run, "fallback", "gpu_profile")
    for profile in (plain, fallback):
        assert profile["task"]["backend"] == "docker"
        assert profile["host"] == get_hostname()  # the worker, as Airflow names it for the task instance
        assert profile["node"] != profile["host"] and len(profile["node"]) == 12  # the container's short id
        # /proc/pressure is the kernel's, not the container's: the host's view from inside the container too
        assert profile["host_cpu"]["source"] == "/proc/pressure/cpu" and profile["host_cpu"]["scope"] == "host"
    assert plain["cpu_fallback"] is False
    if gpu_runtime_problem is None:  # an engine with the NVIDIA runtime gives the container its GPU
        assert fallback["cpu_fallback"] is False
    else:
        assert fallback["cpu_fallback"] is True and fallback["kind"] == "cpu"
        reason = fallback["cpu_fallback_reason"]
        assert reason == f"the Docker engine cannot start GPU containers ({gpu_runtime_problem})", reason
        assert fallback["advice"][0] == f"ran on the CPU instead of its GPUs (on_missing_gpu='cpu'): {reason}"
