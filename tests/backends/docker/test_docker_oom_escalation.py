"""OOM escalation on Docker, for real: an OOM-killed container's next try gets the next memory step."""

from __future__ import annotations

import pytest
from conftest import REPO
from helpers import load_dag, run_dag, task_states, xcom

from airflow_gpu_provider.escalation import tries as escalation

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("airflow_home", "no_leaks")]


def test_an_oom_killed_container_retries_with_more_memory(capfd, docker_engine):
    dr = run_dag(load_dag(REPO / "tests" / "dags" / "docker_dags.py", "docker_oom_escalation"))
    assert task_states(dr) == {"grow": "success"}
    value = xcom(dr, "grow")
    assert value["held_mb"] == 160
    assert value["resources"]["memory"] == 512 * 2**20  # the task saw the memory step it ran with
    tries = xcom(dr, "grow", escalation.XCOM_KEY)["tries"]
    assert [(t["kind"], t["resources"]["memory"]) for t in tries] == [
        ("host_oom", 64 * 2**20),
        ("success", 512 * 2**20),
    ]
    out = capfd.readouterr()
    log = out.out + out.err
    assert "was killed because it ran out of memory (OOM" in log
    assert (
        "try 2: OOM escalation GPU step 0/0, memory step 1/1: no GPU, 512.0 MiB memory (try 1 ran out of host memory)"
        in log
    )
