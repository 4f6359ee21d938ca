"""The Ray backend on a real two-node Ray cluster (``ray_cluster.py``: 2 logical GPUs per node), through Airflow.

Each test runs a DAG of tests/dags/ray_dags.py in a worker process (``dag.test()``, the real task runner) and checks
what the jobs saw, what came back, and that no job of the provider is left on the cluster. A worker's start (Airflow,
the DAG bundle synced) is the dearest step here: one DAG checks several things, task by task.
"""

from __future__ import annotations

import asyncio
import glob
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from backends.ray.ray_cluster import client, jobs
from helpers import database_copy, start_worker, worker_result

from airflow_gpu_provider.backends.ray.trigger import RayJobTrigger

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("airflow_home", "ray_cluster_address")]
DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "ray_dags.py"


def _run(dag_id: str, **kwargs) -> tuple[dict, str]:
    log, _ = start_worker(DAG_FILE, dag_id, **kwargs).communicate(timeout=600)
    return worker_result(log), log


def _in_background(dag_id: str, **kwargs) -> tuple[subprocess.Popen, list[str]]:
    """A worker whose output is read meanwhile (a full pipe would stop it), and where its log will be."""
    worker, log = start_worker(DAG_FILE, dag_id, **kwargs), []
    threading.Thread(target=lambda: log.append(worker.communicate()[0]), daemon=True).start()
    return worker, log


def _ended(worker: subprocess.Popen, log: list[str]) -> str:
    worker.wait(timeout=400)
    deadline = time.monotonic() + 30
    while not log and time.monotonic() < deadline:
        time.sleep(0.1)
    return log[0]


def _at_once(dag_id: str, folder: Path) -> list[tuple[dict, str]]:
    """Two runs of the DAG in two workers at the same time (their functions wait for each other: a barrier)."""
    workers = []
    for day in (1, 2):
        home = folder / f"worker{day}"
        home.mkdir()
        env = {
            "AIRFLOW_GPU_TEST_BARRIER": str(folder / "barrier"),
            **database_copy(Path(os.environ["AIRFLOW_HOME"]) / "airflow.db", home / "airflow.db"),
        }
        workers.append(_in_background(dag_id, logical_date=f"2024-02-0{day}T00:00:00+00:00", env=env))
    return [(worker_result(log), log) for log in (_ended(*worker) for worker in workers)]


def _no_job_left(address: str) -> None:
    deadline = time.monotonic() + 20
    while (left := jobs(address)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == [], [(j.submission_id, j.status) for j in left]


def _end_task_instance(dag_id: str, state: str) -> None:
    """Mark the DAG's task instances ended, as a user does in the UI."""
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        session.query(TaskInstance).filter(TaskInstance.dag_id == dag_id).update({"state": state})


def test_gpus_code_requirements_models_deferral_timeout_oom_and_a_durable_job_whose_task_ended(ray_cluster_address):
    # a durable job's worker dies; its task instance is then marked failed (no try will take the job over)
    worker, _ = _in_background("ray_durable_sleeps")
    deadline = time.monotonic() + 300
    while not (running := [j for j in jobs(ray_cluster_address) if str(j.status) == "RUNNING"]):
        assert time.monotonic() < deadline and worker.poll() is None, "the durable task's job never started"
        time.sleep(0.5)
    worker.kill()
    worker.wait()
    [durable] = running
    assert durable.metadata["durable"] == "true" and str(durable.status) == "RUNNING"
    _end_task_instance("ray_durable_sleeps", "failed")

    # the next Ray task on this host stops it before it submits its own job; then each task of ray_basics
    started = time.monotonic()
    no_token = {"conn_type": "ray", "extra": {"address": ray_cluster_address}}  # the cluster's, without its token
    result, log = _run("ray_basics", env={"AIRFLOW_CONN_RAY_NO_TOKEN": json.dumps(no_token)})
    assert f"Stopped Ray job {durable.submission_id}, whose task instance has ended" in log, log[-4000:]
    states = dict.fromkeys(("timeout", "missing_module", "no_token"), "failed") | dict.fromkeys(
        ("one_gpu", "requirement", "second_model", "no_such_model", "deferred", "grow"), "success"
    )
    assert result["states"] == states, log[-6000:]
    # token auth: the cluster refuses a client without the token, and the provider sends nothing without one
    from ray.job_submission import JobSubmissionClient

    with pytest.raises(Exception, match="Authentication required"):
        JobSubmissionClient(ray_cluster_address).submit_job(entrypoint="true")
    assert f"No token for the Ray cluster {ray_cluster_address}" in log
    # issue 36: the job names its interpreter; one whose imports do not resolve there fails at once, saying so
    assert f"[gpu] Ray runs the task with {sys.executable} (Python " in log
    assert "the task imports airflow_gpu_no_such_module, which this Ray node's Python cannot" in log
    xcom = result["xcom"]
    assert xcom["one_gpu"]["gpus"] in ("0", "1")  # one GPU id
    assert xcom["one_gpu"]["plmod"] == 42 and xcom["one_gpu"]["layers"]  # modules= shipped in the working_dir
    assert xcom["requirement"] is True  # installed by the cluster from the job's runtime_env (uv)
    assert xcom["second_model"]["node"] == "127.0.0.2"  # accelerator=["B200", "H100"]: the H100 node
    assert xcom["no_such_model"]["gpus"] == "" and xcom["no_such_model"]["resources"]["cpu_fallback"] is True
    assert "the Ray cluster has 0 node(s) that could run it" in log and "running on CPU instead" in log
    assert "ended SUCCEEDED on node 127.0.0.2" in log
    # deferrable=True: the trigger watched the job (dag.test() runs it in line), its result came back
    assert xcom["deferred"]["gpus"] in ("0", "1")
    assert "Deferred: the triggerer watches Ray job" in log and "running trigger in line" in log
    # execution_timeout=10s stopped the job (no job is left below)
    assert "AirflowTaskTimeout" in log
    # an OOM on the first rung (64 MiB), then the next try on the next one
    assert xcom["grow"] == {"held_mb": 160, "memory": 512 * 2**20}
    assert "ran out of host memory" in log
    print(f"ray_basics ran in {time.monotonic() - started:.0f}s")
    _no_job_left(ray_cluster_address)


def test_two_gpus_tasks_run_at_once_on_the_two_nodes_and_two_half_gpu_tasks_share_one_gpu(
    ray_cluster_address, tmp_path
):
    (first, log1), (second, log2) = _at_once("ray_at_once", tmp_path)
    both = {"two_gpus": "success", "half_gpu": "success"}
    assert first.get("states") == both, log1[-6000:]
    assert second.get("states") == both, log2[-6000:]
    one, two = first["xcom"]["two_gpus"], second["xcom"]["two_gpus"]
    assert sorted(one["gpus"].split(",")) == sorted(two["gpus"].split(",")) == ["0", "1"]
    assert one["node"] != two["node"] and "127.0.0.2" in (one["node"], two["node"])  # one on each node
    assert max(one["start"], two["start"]) < min(one["end"], two["end"])  # at once

    one, two = first["xcom"]["half_gpu"], second["xcom"]["half_gpu"]
    assert one["gpus"] == two["gpus"] and one["gpus"] in ("0", "1")  # the same GPU
    assert one["node"] == two["node"] != "127.0.0.2"  # the head: label_selector gpu-model=A100
    assert max(one["start"], two["start"]) < min(one["end"], two["end"])  # at once
    assert one["resources"]["gpu_count"] == 0.5
    _no_job_left(ray_cluster_address)


def test_no_jobs_api_reader_sees_a_tasks_secrets_and_on_kill_stops_the_job(ray_cluster_address):
    """H4 of issue 34: every holder of the cluster's token (any job's code: its node has the token) reads every job's
    record and log through the Jobs API; a task's variables and arguments are in none of them, nor left on a node."""
    worker, output = _in_background("ray_sleeps")
    deadline = time.monotonic() + 300
    while not (running := [j for j in jobs(ray_cluster_address) if str(j.status) == "RUNNING"]):
        assert time.monotonic() < deadline, "the task's job never started"
        time.sleep(0.5)
    reader, [victim] = client(ray_cluster_address), running
    while "sleeping" not in (logs := reader.get_job_logs(victim.submission_id)) and time.monotonic() < deadline:
        time.sleep(0.5)  # the task runs: the reaper has set its variables and taken its files away
    seen = repr(reader.list_jobs()) + repr(reader.get_job_info(victim.submission_id)) + logs
    assert "airflow_gpu_ray_reaper.py" in seen and "sleeping" in seen  # what a reader does see
    assert "wandb-secret-8c2d" not in seen and "argument-secret-6f1e" not in seen, seen
    unpacked = glob.glob("/tmp/rt-*/session_*/runtime_resources/working_dir_files/*/airflow_gpu_ray_reaper.py")
    assert unpacked  # the nodes' copies of the working_dirs: not one keeps the task's envelope or variables
    assert not [
        p for f in unpacked for p in Path(f).parent.glob("*.json") if "secret-" in p.read_text("utf-8", "replace")
    ]
    # another task's trigger naming this job (its arguments are a task's to write) is ended: the job is left alone
    trigger = RayJobTrigger(victim.submission_id, {"ray_conn_id": None, "address": None})
    trigger.task_instance = SimpleNamespace(
        dag_id="another", task_id="task", run_id=victim.metadata["run_id"], map_index=-1
    )
    asyncio.run(trigger.on_kill())
    assert str(reader.get_job_status(victim.submission_id)) == "RUNNING"
    worker.send_signal(signal.SIGTERM)  # as Airflow ends a task: on_kill
    log = _ended(worker, output)
    assert "Stopping Ray job" in log, log[-4000:]
    _no_job_left(ray_cluster_address)


def test_accelerate_on_two_nodes_runs_its_own_test_script_and_a_world_of_4(ray_cluster_address, tmp_path):
    """And a node whose rank fails after the training: the other node is stopped, not left in torch's exit barrier."""
    spec = importlib.util.find_spec("accelerate")
    assert spec is not None and spec.origin is not None
    script = os.path.join(os.path.dirname(spec.origin), "test_utils", "scripts", "test_script.py")
    result, log = _run("ray_accelerate", conf={"script": script, "out": str(tmp_path)})
    states = {"test_script": "success", "world_size_4": "success", "node_1_fails": "failed"}
    assert result["states"] == states, log[-6000:]
    assert log.count("2 nodes reserved (STRICT_SPREAD)") == 3
    assert "rank 1 fails on purpose after its training" in log, log[-6000:]
    assert "[gpu] node 1 failed: stopping the other nodes" in log, log[-6000:]  # not 300 s in the exit barrier
    assert sorted(path.name for path in (tmp_path / "fails").iterdir()) == ["rank0.json", "rank1.json"]
    assert "**Training integration test**" in log and "Num processes: 2" in log  # accelerate's script, to its end
    ranks = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("rank*.json"))]
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3] and {r["world_size"] for r in ranks} == {4}
    assert {r["backend"] for r in ranks} == {"gloo"}
    _no_job_left(ray_cluster_address)
