"""Reattach for real: a Celery worker running a Docker task and a Slurm task is SIGKILLed while their container
and job (on the tests' Slurm cluster) run.

The scheduler finds the task instances' heartbeats gone and retries them; each retry, on a new worker, finds the
container or job the first try recorded in the task state store and takes it over instead of starting a second
copy: the task's result is the first container's or job's, and exactly one process ran the function (each run
appends a line to a file in the task's checkpoint folder, and the function returns how many lines it found). One
Airflow of separate processes serves both backends: its start is the dearest step.
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
SLURM_DAG_ID = "reattach_slurm_after_worker_kill"


@pytest.fixture
def cluster(tmp_path, slurm):
    with reattach_cluster(tmp_path, root_mode=0o700) as cluster:
        yield cluster


def _worker(cluster: Cluster, name: str) -> None:
    celery_worker(cluster, name, slots=2)  # the Docker task and the Slurm task


def _active(slurm) -> list[tuple[str, str]]:
    return [(str(j["job_id"]), j["job_state"]) for j in slurm.jobs() if j["job_state"] in ("PENDING", "RUNNING")]


def _task_log(cluster: Cluster, try_number: int) -> str:
    return try_log(cluster, DAG_ID, try_number)


def test_a_killed_workers_container_and_job_are_taken_over_by_the_next_try(cluster, docker_client, slurm):
    _worker(cluster, "worker-1")
    cluster.wait_for_dag(DAG_ID)
    for dag_id in (DAG_ID, SLURM_DAG_ID):
        cluster.trigger(dag_id, "r1", {"root": str(cluster.root)})

    # The first tries' container and job have started the function: their lines are in the checkpoint folders
    runs = cluster._wait(
        lambda: (found := sorted(cluster.root.glob("**/runs.txt"))) and len(found) == 2 and found,
        180,
        "the first container and job to start",
    )
    runs = [path for path in runs if DAG_ID in path.parts]  # the Docker task's (the Slurm task's: below)
    [(job, _)] = _active(slurm)
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
    assert _active(slurm) == [(job, "RUNNING")]  # so does the job
    _worker(cluster, "worker-2")
    # the second tries have taken the container and the job over (or a run ended without): the functions may end now
    cluster._wait(
        lambda: all(
            "Reattached to" in try_log(cluster, dag_id, 2) or cluster.xcom(dag_id, "r1", "task")
            for dag_id in (DAG_ID, SLURM_DAG_ID)
        ),
        240,
        "the second tries",
    )
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

    # The Slurm task: the same, with its job
    assert cluster.wait_for_run(SLURM_DAG_ID, "r1", timeout=120) == "success", cluster.logs()
    second = try_log(cluster, SLURM_DAG_ID, 2)
    assert f"Reattached to Slurm job {job}, left by an earlier try" in second, second[-3000:]
    assert "done after 1 run(s)" in second and "Submitted Slurm job" not in second
    assert cluster.xcom(SLURM_DAG_ID, "r1", "task") == {"runs": 1}  # one process ran the function
    assert list(cluster.root.glob(f"{SLURM_DAG_ID}/**/runs.txt")) == []  # deleted with the successful run
    assert _active(slurm) == [] and list(slurm.shared.glob("airflow-gpu-*/job-*")) == []
