"""Durable for real: a Slurm task's Celery worker is SIGKILLed while its job runs on the tests' Slurm cluster.

The scheduler finds the task instance's heartbeat gone and retries it; the retry, on a new worker, finds the job id
the first try recorded in the task state store and takes the job over instead of submitting a second one: the
task's result is the first job's, and exactly one process ran the function (each run appends a line to a file in
the task's checkpoint folder). The pattern of tests/executors/test_reattach.py, with a Slurm job.
"""

from __future__ import annotations

import os
import signal

import pytest
from executors.cluster import Cluster, celery_worker, reattach_cluster, try_log

pytest.importorskip("airflow.providers.celery", reason="the Celery provider is not installed (the dev extra has it)")
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("slurm")]
DAG_ID = "reattach_slurm_after_worker_kill"


@pytest.fixture
def cluster(tmp_path, slurm):
    with reattach_cluster(tmp_path, root_mode=0o755) as cluster:
        yield cluster


def _active(slurm) -> list[tuple[str, str]]:
    return [(str(j["job_id"]), j["job_state"]) for j in slurm.jobs() if j["job_state"] in ("PENDING", "RUNNING")]


def test_a_killed_workers_job_is_taken_over_by_the_next_try(cluster: Cluster, slurm):
    celery_worker(cluster, "worker-1")
    cluster.wait_for_dag(DAG_ID)
    cluster.run("dags", "unpause", DAG_ID)
    cluster.run("dags", "trigger", DAG_ID, "--run-id", "r1", "--conf", f'{{"root": "{cluster.root}"}}')

    runs = cluster._wait(lambda: list(cluster.root.glob("**/runs.txt")), 240, "the first job to start")
    [(first, _)] = _active(slurm)

    # The worker dies as an OOM kill would end it: its whole process group, at once
    os.killpg(cluster.processes["worker-1"].pid, signal.SIGKILL)
    cluster.processes.pop("worker-1").wait()
    assert _active(slurm) == [(first, "RUNNING")]  # the job outlives its worker
    celery_worker(cluster, "worker-2")

    state = cluster.wait_for_run(DAG_ID, "r1", timeout=300)
    second = try_log(cluster, DAG_ID, 2)
    assert state == "success", f"{cluster.task_instances(DAG_ID, 'r1')}\n{cluster.logs()}"
    assert f"Reattached to Slurm job {first}, left by an earlier try" in second, second[-3000:]
    assert "done after 1 run(s)" in second  # the job's output, followed by the second try
    assert cluster.xcom(DAG_ID, "r1", "task") == {"runs": 1}  # one process ran the function
    assert "Submitted Slurm job" not in second
    assert not runs[0].exists()  # the successful run's checkpoints are deleted with it
    assert _active(slurm) == [] and list(slurm.shared.glob("airflow-gpu-*/job-*")) == []
