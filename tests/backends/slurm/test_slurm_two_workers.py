"""Two workers on the tests' Slurm cluster at once (``dag.test()`` each, with a copy of the metadata DB).

A worker's start is the dearest step (20 to 30 s here), and Slurm ends a job past its time limit only at its
controller's next look (every 30 s, fixed in 22.05): so one run of two workers, side by side, tells three stories,
each its own test of what the run left:

- each worker's first task wants the cluster's only H100: one job runs (held by the test until the other job waits
  for it, ``Resources``), then the other; never together;
- then one worker's two tasks are preempted by a job of partition ``high`` (``PreemptMode=REQUEUE``): with
  ``requeue=True`` Slurm requeues the job (the same id) and the same try follows it (one job, run twice by Slurm, no
  second copy by Airflow); with ``requeue=False`` it ends ``PREEMPTED``, an infrastructure failure, and the next try
  (a new job) waits for the only H100 to run again on its node;
- meanwhile the other worker's task runs on partition ``quick`` (one node), whose running job the test shortens to
  end now (``scontrol update EndTime``, as an admin may): Slurm's own limit check ends it ``TIMEOUT``, an
  infrastructure failure, and the next try runs on the partition's one node again.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from backends.slurm.slurm_cluster import NOTHING, leftovers
from helpers import database_copy, start_worker, worker_result

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("airflow_home")]
DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "slurm_dags.py"
DEADLINE = 300.0


def _task(job: dict) -> str:
    return str(job["comment"]).partition('"task_id":"')[2].partition('"')[0]


def _started(marks: Path, job: dict) -> bool:
    """Whether the job's function has started (its line is in the task's marks file)."""
    lines = marks.read_text().splitlines() if marks.exists() else []
    return any(line.split()[0] == str(job["job_id"]) for line in lines)


def _drive(slurm, tmp: Path, workers: list) -> None:
    """Open the H100 gate once one job waits for the other, preempt each requeue task's first job once its function
    runs, and shorten the timeout task's first job; until both workers end."""
    gate, to_preempt, timed = tmp / "gate", {"requeue_true", "requeue_false"}, False
    deadline = time.monotonic() + DEADLINE
    while any(worker.poll() is None for worker in workers) and time.monotonic() < deadline:
        jobs = [job for job in slurm.jobs() if job["job_state"] in ("PENDING", "RUNNING")]
        h100 = sorted(job["job_state"] for job in jobs if _task(job) == "h100")
        waits = any(job.get("state_reason") == "Resources" for job in jobs if _task(job) == "h100")
        if not gate.exists() and h100 == ["PENDING", "RUNNING"] and waits:
            gate.touch()
        for job in jobs:
            task = _task(job)
            if job["job_state"] != "RUNNING" or not _started(tmp / f"marks-{task}", job):
                continue
            if task in to_preempt:
                to_preempt.discard(task)
                slurm.run("sbatch", "-p", "high", "--gres=gpu:h100:1", f"--chdir={tmp}", "--wrap", "sleep 1")
            elif task == "timeout" and not timed:
                timed = True
                now = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() + 2))
                slurm.run("scontrol", "update", f"JobId={job['job_id']}", f"EndTime={now}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def two_workers(slurm_session, airflow_home, tmp_path_factory) -> dict[str, tuple[dict, str]]:
    """The run of both workers: each DAG's result and log (the module's tests check one story each)."""
    slurm, variables = slurm_session
    tmp = tmp_path_factory.mktemp("two-workers")
    tmp.chmod(0o755)
    env = {**variables, "AIRFLOW_GPU_TEST_GATE": str(tmp / "gate"), "AIRFLOW_GPU_TEST_MARKS": str(tmp / "marks")}
    workers, dags = [], ("slurm_h100_then_preempted", "slurm_h100_then_timeout")
    for dag_id in dags:
        home = tmp / dag_id
        home.mkdir()
        copy = database_copy(airflow_home / "airflow.db", home / "airflow.db")
        workers.append(start_worker(DAG_FILE, dag_id, env={**env, **copy}))
    logs = [tmp / f"{dag_id}.log" for dag_id in dags]
    readers = []
    try:
        for worker, path in zip(workers, logs, strict=True):
            reader = threading.Thread(target=lambda w=worker, p=path: p.write_text(w.communicate()[0]), daemon=True)
            reader.start()
            readers.append(reader)
        _drive(slurm, tmp, workers)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
        for reader in readers:
            reader.join(30)
    texts = [path.read_text() if path.exists() else "" for path in logs]
    return {dag_id: (worker_result(text), text) for dag_id, text in zip(dags, texts, strict=True)}


def test_two_tasks_wanting_the_only_h100_run_one_after_the_other(slurm, two_workers):
    logs = [log for _, log in two_workers.values()]
    seen = [result["xcom"]["h100"] for result, _ in two_workers.values() if "h100" in result.get("xcom", {})]
    assert len(seen) == 2, [log[-4000:] for log in logs]
    first, second = sorted(seen, key=lambda found: found["start"])
    assert first["end"] <= second["start"], (first, second)  # never together
    assert first["node"] == second["node"] == slurm.nodes[0] and first["job"] != second["job"]
    assert any("waits for the resources it asks for (busy now) (Resources)" in log for log in logs)
    assert leftovers(slurm) == NOTHING


def test_a_preempted_job_is_followed_by_the_same_try_or_retried_by_airflow(slurm, two_workers):
    result, log = two_workers["slurm_h100_then_preempted"]
    assert result["states"] == {"h100": "success", "requeue_true": "success", "requeue_false": "success"}, log[-6000:]
    runs = result["xcom"]["requeue_true"]["runs"]
    assert len(runs) == 2 and runs[0].split()[0] == runs[1].split()[0], runs  # one job, run again by Slurm
    assert [run.split()[1] for run in runs] == ["0", "1"]
    assert "Slurm requeued job" in log and "this try follows it again" in log
    runs = result["xcom"]["requeue_false"]["runs"]
    assert len(runs) == 2 and runs[0].split()[0] != runs[1].split()[0], runs  # a new job, by Airflow's retry
    assert "ended PREEMPTED" in log and "infrastructure" in log
    assert "no other node fits this job: it waits for that node's return" in log
    assert result["xcom"]["requeue_false"]["node"] == slurm.nodes[0]  # the only H100's node, again
    assert leftovers(slurm) == NOTHING


def test_a_job_past_its_time_limit_is_an_infrastructure_failure(slurm, two_workers):
    result, log = two_workers["slurm_h100_then_timeout"]
    assert result["states"] == {"h100": "success", "timeout": "success"}, log[-6000:]
    assert "ended TIMEOUT" in log and "infrastructure" in log and "time limit" in log
    runs = result["xcom"]["timeout"]["runs"]
    assert len(runs) == 2 and runs[0].split()[0] != runs[1].split()[0], runs  # the next try: a new job
    assert "no other node fits this job: it waits for that node's return" in log
    assert result["xcom"]["timeout"]["node"] == slurm.nodes[-1]  # the partition's one node
    assert leftovers(slurm) == NOTHING
