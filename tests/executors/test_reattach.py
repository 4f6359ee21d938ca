"""Reattach for real: a Docker task's Celery worker is SIGKILLed while its container runs.

The scheduler finds the task instance's heartbeat gone and retries it; the retry, on a new worker, finds the
container the first try recorded in the task state store and takes it over instead of starting a second copy: the
task's result is the first container's, and exactly one process ran the function (each run appends a line to a
file in the task's checkpoint folder, and the function returns how many lines it found).
"""

from __future__ import annotations

import os
import signal

import psutil
import pytest
from cluster import Cluster, celery_worker, let_go, reattach_cluster, try_log

pytest.importorskip("airflow.providers.celery", reason="the Celery provider is not installed (the dev extra has it)")
pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.usefixtures("no_leaks")]
DAG_ID = "reattach_after_worker_kill"


@pytest.fixture
def cluster(tmp_path):
    with reattach_cluster(tmp_path, root_mode=0o700) as cluster:
        yield cluster


def _worker(cluster: Cluster, name: str) -> None:
    celery_worker(cluster, name)


def _task_log(cluster: Cluster, try_number: int) -> str:
    return try_log(cluster, DAG_ID, try_number)


def test_a_killed_workers_container_is_taken_over_by_the_next_try(cluster, docker_client):
    _worker(cluster, "worker-1")
    cluster.wait_for_dag(DAG_ID)
    cluster.run("dags", "unpause", DAG_ID)
    cluster.run("dags", "trigger", DAG_ID, "--run-id", "r1", "--conf", f'{{"root": "{cluster.root}"}}')

    # The first try's container has started the function: its line is in the checkpoint folder
    runs = cluster._wait(lambda: list(cluster.root.glob("**/runs.txt")), 180, "the first container to start")
    started = cluster._wait(lambda: "Started container" in _task_log(cluster, 1), 30, "the first try's log")
    assert started
    first = _task_log(cluster, 1).split("Started container ", 1)[1].split()[0]
    ours = docker_client.containers(filters={"label": "airflow-gpu-provider.run_id=r1"})
    assert [c["Id"][:12] for c in ours] == [first]

    # The worker dies as an OOM kill would end it: its whole process group, at once. Airflow's task process leads
    # a group of its own, so the first try lives on, orphaned: it must leave the container to the try that takes
    # it over (it cannot even ask the task state store, its supervisor is gone), not remove it when it ends.
    tree = psutil.Process(cluster.processes["worker-1"].pid).children(recursive=True)
    os.killpg(cluster.processes["worker-1"].pid, signal.SIGKILL)
    cluster.processes.pop("worker-1").wait()
    orphans = [process for process in tree if process.is_running() and process.status() != psutil.STATUS_ZOMBIE]
    assert orphans, "the first try's task process should outlive its worker's process group"
    assert docker_client.inspect_container(first)["State"]["Running"]  # the container outlives its worker
    _worker(cluster, "worker-2")
    # the second try has taken the container over (or the run ended without it): the function may end now
    cluster._wait(lambda: "Reattached to" in _task_log(cluster, 2) or cluster.xcom(DAG_ID, "r1", "task"), 240, "try 2")
    let_go(cluster.root)

    state = cluster.wait_for_run(DAG_ID, "r1", timeout=240)
    tis = cluster.task_instances(DAG_ID, "r1")
    second = _task_log(cluster, 2)
    assert state == "success", f"{tis}\n{cluster.logs()}"
    assert f"Reattached to container {first}, left running by an earlier try" in second, second[-3000:]
    assert "done after 1 run(s)" in second  # the container's output, followed by the second try
    assert cluster.xcom(DAG_ID, "r1", "task") == {"runs": 1}  # one process ran the function
    assert "Started container" not in second
    assert not runs[0].exists()  # the successful run's checkpoints are deleted with it
    assert docker_client.containers(all=True, filters={"label": "airflow-gpu-provider.run_id=r1"}) == []
    _, alive = psutil.wait_procs(orphans, timeout=60)  # the orphaned first try ends with its container
    assert alive == [], alive
