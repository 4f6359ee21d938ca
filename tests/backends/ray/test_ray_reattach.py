"""Durable for real: a Ray task's Celery worker is SIGKILLed while its job runs on the tests' Ray cluster.

The scheduler finds the task instance's heartbeat gone and retries it; the retry, on a new worker, finds the job's
submission id the first try recorded in the task state store and takes the job over instead of submitting a second
one: the task's result is the first job's, and exactly one process ran the function (each run appends a line to a
file in the task's checkpoint folder). The pattern of tests/executors/test_reattach.py, with a Ray job.

Then the second worker is SIGKILLed too, with its task process, and a user marks the task instance failed: the API
server's listener (``backends/ray/listener.py``) stops the job at once, with no other Ray task on the host.
"""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
from backends.ray.ray_cluster import jobs
from executors.cluster import Cluster, celery_worker, let_go, reattach_cluster, try_log

pytest.importorskip("airflow.providers.celery", reason="the Celery provider is not installed (the dev extra has it)")
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster_address")]
DAG_ID = "reattach_ray_after_worker_kill"


@pytest.fixture
def cluster(tmp_path, ray_cluster_address):
    with reattach_cluster(tmp_path, root_mode=0o755) as cluster:
        yield cluster


def _worker(cluster: Cluster, name: str) -> None:
    celery_worker(cluster, name)


def _task_log(cluster: Cluster, try_number: int) -> str:
    return try_log(cluster, DAG_ID, try_number)


def test_a_killed_workers_job_is_taken_over_by_the_next_try(cluster, ray_cluster_address):
    _worker(cluster, "worker-1")
    cluster.wait_for_dag(DAG_ID)
    cluster.trigger(DAG_ID, "r1", {"root": str(cluster.root)})

    # The first try's job has started the function: its line is in the checkpoint folder
    runs = cluster._wait(lambda: list(cluster.root.glob("**/runs.txt")), 240, "the first job to start")
    [first] = [j.submission_id for j in jobs(ray_cluster_address) if str(j.status) == "RUNNING"]

    # The worker dies as an OOM kill would end it: its whole process group, at once. Airflow's task process leads a
    # group of its own and lives on, orphaned: it must leave the job to the try that takes it over.
    os.killpg(cluster.processes["worker-1"].pid, signal.SIGKILL)
    cluster.processes.pop("worker-1").wait()
    assert [(j.submission_id, str(j.status)) for j in jobs(ray_cluster_address)] == [(first, "RUNNING")]
    _worker(cluster, "worker-2")
    # the second try has taken the job over (or the run ended without it): the function may end now
    cluster._wait(lambda: "Reattached to" in _task_log(cluster, 2) or cluster.xcom(DAG_ID, "r1", "task"), 300, "try 2")
    let_go(cluster.root)

    state = cluster.wait_for_run(DAG_ID, "r1", timeout=300)
    second = _task_log(cluster, 2)
    assert state == "success", f"{cluster.task_instances(DAG_ID, 'r1')}\n{cluster.logs()}"
    assert f"Reattached to Ray job {first}, left running by an earlier try" in second, second[-3000:]
    assert "done after 1 run(s)" in second  # the job's output, followed by the second try
    assert cluster.xcom(DAG_ID, "r1", "task") == {"runs": 1}  # one process ran the function
    assert "Submitted Ray job" not in second
    assert not runs[0].exists()  # the successful run's checkpoints are deleted with it
    assert jobs(ray_cluster_address) == []  # collected, then deleted from the cluster

    # A second run's worker dies with its task process (nothing of it follows the job), and a user marks the task
    # instance failed: its durable job, which no try will take over now, is stopped by the API server's listener
    cluster.trigger(DAG_ID, "r2", {"root": str(cluster.root), "seconds": 300})
    cluster._wait(lambda: [j for j in jobs(ray_cluster_address) if str(j.status) == "RUNNING"], 240, "the r2 job")
    worker = psutil.Process(cluster.processes["worker-2"].pid)
    for process in [worker, *worker.children(recursive=True)]:
        process.kill()
    cluster.processes.pop("worker-2").wait()
    marked = time.monotonic()
    cluster.api(f"/api/v2/dags/{DAG_ID}/dagRuns/r2/taskInstances/task", {"new_state": "failed"}, "PATCH")
    cluster._wait(lambda: not jobs(ray_cluster_address), 60, "the listener to stop and delete the r2 job")
    print(f"the job of the failed task instance was stopped and deleted {time.monotonic() - marked:.1f}s after")
