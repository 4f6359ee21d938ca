"""The Ray backend on a real two-node Ray cluster (``ray_cluster.py``: 2 logical GPUs per node), through Airflow.

Each test runs its DAG (tests/dags/ray_dags.py) in a worker process (``dag.test()``, the real task runner) and
checks what the job saw, what came back, and that no job of the provider is left on the cluster.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from backends.ray.ray_cluster import jobs
from helpers import start_worker, worker_result

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("airflow_home", "ray_cluster_address")]
DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "ray_dags.py"


def _run(dag_id: str, **kwargs) -> tuple[dict, str]:
    log, _ = start_worker(DAG_FILE, dag_id, **kwargs).communicate(timeout=400)
    return worker_result(log), log


def _in_background(dag_id: str, **kwargs) -> tuple[subprocess.Popen, list[str]]:
    """A worker whose output is read meanwhile (a full pipe would stop it), and where its log will be."""
    worker, log = start_worker(DAG_FILE, dag_id, **kwargs), []
    threading.Thread(target=lambda: log.append(worker.communicate()[0]), daemon=True).start()
    return worker, log


def _ended(worker: subprocess.Popen, log: list[str]) -> str:
    worker.wait(timeout=300)
    deadline = time.monotonic() + 30
    while not log and time.monotonic() < deadline:
        time.sleep(0.1)
    return log[0]


def _at_once(dag_id: str, barrier: Path) -> list[tuple[dict, str]]:
    """Two runs of the DAG in two workers at the same time (their functions wait for each other: ``barrier``)."""
    env = {"AIRFLOW_GPU_TEST_BARRIER": str(barrier)}
    workers = [_in_background(dag_id, logical_date=f"2024-02-0{day}T00:00:00+00:00", env=env) for day in (1, 2)]
    return [(worker_result(log), log) for log in (_ended(*worker) for worker in workers)]


def _no_job_left(address: str) -> None:
    deadline = time.monotonic() + 20
    while (left := jobs(address)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == [], [(j.submission_id, j.status) for j in left]


def test_gpus_project_code_a_requirement_and_models(ray_cluster_address):
    result, log = _run("ray_basics")
    assert set(result["states"].values()) == {"success"}, log[-4000:]
    xcom = result["xcom"]
    assert xcom["one_gpu"]["gpus"] in ("0", "1")  # one GPU id
    assert xcom["one_gpu"]["plmod"] == 42 and xcom["one_gpu"]["layers"]  # modules= shipped in the working_dir
    assert xcom["requirement"] is True  # installed by the cluster from the job's runtime_env (uv)
    assert xcom["second_model"]["node"] == "127.0.0.2"  # accelerator=["B200", "H100"]: the H100 node
    assert xcom["no_such_model"]["gpus"] == "" and xcom["no_such_model"]["resources"]["cpu_fallback"] is True
    assert "the Ray cluster has 0 node(s) that could run it" in log and "running on CPU instead" in log
    assert "ended SUCCEEDED on node 127.0.0.2" in log
    _no_job_left(ray_cluster_address)


def test_two_tasks_of_two_gpus_run_at_once_on_the_two_nodes(ray_cluster_address, tmp_path):
    (first, log1), (second, log2) = _at_once("ray_two_gpus", tmp_path)
    assert first["states"] == second["states"] == {"task": "success"}, (log1 + log2)[-4000:]
    one, two = first["xcom"]["task"], second["xcom"]["task"]
    assert sorted(one["gpus"].split(",")) == sorted(two["gpus"].split(",")) == ["0", "1"]
    assert one["node"] != two["node"] and "127.0.0.2" in (one["node"], two["node"])  # one on each node
    assert max(one["start"], two["start"]) < min(one["end"], two["end"])  # at once


def test_two_half_gpu_tasks_share_one_gpu(ray_cluster_address, tmp_path):
    (first, log1), (second, log2) = _at_once("ray_half_gpu", tmp_path)
    assert first["states"] == second["states"] == {"task": "success"}, (log1 + log2)[-4000:]
    one, two = first["xcom"]["task"], second["xcom"]["task"]
    assert one["gpus"] == two["gpus"] and one["gpus"] in ("0", "1")  # the same GPU
    assert one["node"] == two["node"] != "127.0.0.2"  # the head: label_selector gpu-model=A100
    assert max(one["start"], two["start"]) < min(one["end"], two["end"])  # at once
    assert one["resources"]["gpu_count"] == 0.5


def test_on_kill_and_a_timeout_stop_the_job(ray_cluster_address):
    worker, output = _in_background("ray_sleeps")
    deadline = time.monotonic() + 300
    while not any(str(j.status) == "RUNNING" for j in jobs(ray_cluster_address)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert jobs(ray_cluster_address), "the task's job never started"
    time.sleep(2)
    worker.send_signal(signal.SIGTERM)  # as Airflow ends a task: on_kill
    log = _ended(worker, output)
    assert "Stopping Ray job" in log, log[-4000:]
    _no_job_left(ray_cluster_address)

    started = time.monotonic()
    result, log = _run("ray_timeout")
    assert result["states"] == {"task": "failed"}, log[-4000:]
    assert "AirflowTaskTimeout" in log and time.monotonic() - started < 120
    _no_job_left(ray_cluster_address)


def test_a_deferred_task_ends_with_its_result(ray_cluster_address):
    result, log = _run("ray_deferred")
    assert result["states"] == {"task": "success"}, log[-4000:]
    assert result["xcom"]["task"]["gpus"] in ("0", "1")
    assert "Deferred: the triggerer watches Ray job" in log and "running trigger in line" in log
    _no_job_left(ray_cluster_address)


def test_an_out_of_memory_try_climbs_the_ladder(ray_cluster_address):
    result, log = _run("ray_oom_escalation")
    assert result["states"] == {"grow": "success"}, log[-4000:]
    assert result["xcom"]["grow"] == {"held_mb": 160, "memory": 512 * 2**20}
    assert "ran out of host memory" in log  # the first try, on the first rung (64 MiB)
    _no_job_left(ray_cluster_address)


def test_accelerate_on_two_nodes_runs_its_own_test_script_and_a_world_of_4(ray_cluster_address, tmp_path):
    spec = importlib.util.find_spec("accelerate")
    assert spec is not None and spec.origin is not None
    script = os.path.join(os.path.dirname(spec.origin), "test_utils", "scripts", "test_script.py")
    result, log = _run("ray_accelerate", conf={"script": script, "out": str(tmp_path)})
    assert result["states"] == {"test_script": "success", "world_size_4": "success"}, log[-6000:]
    assert log.count("2 nodes reserved (STRICT_SPREAD)") == 2
    assert "**Training integration test**" in log and "Num processes: 2" in log  # accelerate's script, to its end
    ranks = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("rank*.json"))]
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2, 3] and {r["world_size"] for r in ranks} == {4}
    assert {r["backend"] for r in ranks} == {"gloo"}
    _no_job_left(ray_cluster_address)
