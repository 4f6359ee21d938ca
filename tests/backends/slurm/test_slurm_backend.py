"""The Slurm backend on the tests' own two-node cluster (``slurm_cluster.py``), through Airflow (``dag.test()``).

Each test runs a DAG of tests/dags/slurm_dags.py in a worker process (the real task runner) and checks what the
jobs saw, what came back, the class of each failure and where the next try ran, and what is left: no active job,
no job folder, no process a task left behind. A worker's start is the dearest step: one DAG checks several things.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
from backends.slurm.slurm_cluster import NOTHING, leftovers
from helpers import start_worker, worker_result

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("airflow_home")]
DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "slurm_dags.py"


def _run(dag_id: str, **kwargs) -> tuple[dict, str]:
    log, _ = start_worker(DAG_FILE, dag_id, **kwargs).communicate(timeout=600)
    return worker_result(log), log


def _in_background(dag_id: str, **kwargs) -> tuple[subprocess.Popen, list[str]]:
    worker, log = start_worker(DAG_FILE, dag_id, **kwargs), []
    threading.Thread(target=lambda: log.append(worker.communicate()[0]), daemon=True).start()
    return worker, log


def _ended(worker: subprocess.Popen, log: list[str]) -> str:
    worker.wait(timeout=600)
    deadline = time.monotonic() + 30
    while not log and time.monotonic() < deadline:
        time.sleep(0.1)
    return log[0]


def running(slurm, *task_ids: str) -> dict:
    """The running job of one of the tasks (its comment names it); waits up to 2 min."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for job in slurm.jobs():
            if any(f'"task_id":"{task}"' in job["comment"] for task in task_ids) and job["job_state"] == "RUNNING":
                return job
        time.sleep(0.3)
    raise AssertionError(f"no running job of {task_ids}: {slurm.jobs()}")


def test_each_task_gets_exactly_its_gres_gpus_and_leaves_nothing(slurm):
    """GRES per accelerator (and a fallback list as node features), no GPU for a task without one, --mem and
    --cpus-per-task, a requirement installed once into the shared folder's cache, a request no partition can ever
    satisfy failing at once, a deferred task, the REST path; a process a task left behind is stopped with its job."""
    result, log = _run("slurm_basics")
    states, values = result["states"], result["xcom"]
    assert states == {
        "a100": "success", "either": "success", "no_gpu": "success", "requirement": "success",
        "never": "failed", "deferred": "success", "rest": "success", "timeout": "failed",
    }, log[-6000:]  # fmt: skip
    assert values["a100"]["gpus"] == "0" and values["a100"]["node"] in slurm.nodes  # one GPU: its GRES index
    assert "--gres=gpu:a100:1" in log and "--gres=gpu:1 --constraint=a100|h100" in log
    assert values["either"]["gpus"] in ("0", "1")
    assert values["no_gpu"]["gpus"] == "" and "--mem=256M" in log and "--cpus-per-task=1" in log
    assert values["requirement"] is True
    assert "Slurm refused the job: " in log and "no partition of the cluster can ever run 3x" in log, log[-3000:]
    assert "Deferred: the triggerer watches Slurm job" in log
    assert values["rest"]["gpus"] in ("0", "1") and values["rest"]["node"] == slurm.nodes[0]  # the only H100
    assert "--time=1" in log and "Cancelling Slurm job" in log and "AirflowTaskTimeout" in log
    assert leftovers(slurm) == NOTHING


def test_out_of_memory_climbs_to_the_next_memory_rung(slurm):
    result, log = _run("slurm_oom")
    assert result["states"] == {"grow": "success"} and result["xcom"]["grow"] == 300, log[-6000:]
    assert "ended OUT_OF_MEMORY" in log and "--mem=128M" in log and "--mem=1024M" in log


def test_a_node_set_down_is_avoided_by_the_next_try(slurm, tmp_path):
    worker, log = _in_background("slurm_node_down", env={"AIRFLOW_GPU_TEST_MARKS": str(tmp_path / "marks")})
    node = running(slurm, "task")["nodes"]
    slurm.run("scontrol", "update", f"nodename={node}", "state=down", "reason=test")
    try:
        text = _ended(worker, log)
    finally:
        slurm.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
    result = worker_result(text)
    assert result["states"] == {"task": "success"}, text[-6000:]
    assert "ended NODE_FAIL" in text and f"--exclude={node}" in text
    assert result["xcom"]["task"]["node"] != node  # the next try ran on the other node
    assert leftovers(slurm) == NOTHING


def test_accelerate_on_two_nodes_one_srun_task_per_node(slurm, tmp_path):
    """num_processes=2 on num_machines=2: one rank per node, world size 2, each node's rank its machine rank."""
    result, log = _run("slurm_accelerate", conf={"out": str(tmp_path)})
    assert result["states"] == {"two_nodes": "success"}, log[-6000:]
    ranks = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("rank*.json"))]
    assert sorted(rank["rank"] for rank in ranks) == [0, 1] and {rank["world_size"] for rank in ranks} == {2}, ranks
    assert sorted(tuple(rank["node"]) for rank in ranks) == [("0", slurm.nodes[0]), ("1", slurm.nodes[1])]
    assert "--nodes=2 --ntasks-per-node=1" in log
    assert leftovers(slurm) == NOTHING


def test_shares_of_one_gpu_are_gres_shards_side_by_side_while_a_whole_gpu_waits(slurm, tmp_path):
    """gpu_count=0.25 and gpu_share="40GiB" of the only H100 are 1 and 2 of its 4 shards (the CLI, slurmrestd): one
    runs beside another shard job on that GPU while a whole-GPU job waits; each sees its GPU and its shards, and the
    log says how the share is enforced; a GPU out of memory on a share climbs to a whole GPU."""
    gate, sbatch = tmp_path / "gate", ("sbatch", "--parsable", "--mem=64M", f"--chdir={slurm.shared}", "-o/dev/null")
    unenforced = {"AIRFLOW__GPU_POLICY__ALLOW_UNENFORCED_GPU_SHARES": "True"}  # no CUDA here for PyTorch's cap
    other = slurm.run(*sbatch, "--gres=shard:h100:1", "--wrap=sleep 300").strip()
    whole = ""
    try:
        worker, log = _in_background("slurm_shares", env={"AIRFLOW_GPU_TEST_GATE": str(gate), **unenforced})
        quarter = running(slurm, "quarter")
        whole = slurm.run(*sbatch, "--gres=gpu:h100:1", "--wrap=true").strip()
        deadline = time.monotonic() + 30
        while (jobs := {str(job["job_id"]): job for job in slurm.jobs()})[whole]["state_reason"] == "None":
            assert time.monotonic() < deadline, jobs[whole]
            time.sleep(0.2)
        assert jobs[whole]["job_state"] == "PENDING" and jobs[whole]["state_reason"] == "Resources", jobs[whole]
        assert jobs[other]["job_state"] == "RUNNING" and jobs[other]["nodes"] == quarter["nodes"] == slurm.nodes[0]
        slurm.run("scancel", whole)
        gate.touch()
        text = _ended(worker, log)
    finally:
        gate.touch()
        slurm.run("scancel", other, *([whole] if whole else []), check=False)
    result = worker_result(text)
    assert result["states"] == {"quarter": "success", "by_memory": "success", "climbs": "success"}, text[-6000:]
    values = result["xcom"]
    assert values["quarter"]["shards"] == "1" and values["quarter"]["gpus"] in ("0", "1")
    assert values["by_memory"]["shards"] == "2" and values["climbs"]["shards"] is None
    assert "--gres=shard:h100:1" in text and "--gres=shard:a100:2" in text and "--gres=gpu:a100:1" in text
    assert "40.0 GiB of one h100 GPU (2 of its 4 shards), enforced by PyTorch's cap" in text, text[-6000:]
    assert "Slurm's gres/shard enforces no memory" in text and "GPU share NOT enforced" in text
    deadline = time.monotonic() + 30
    while leftovers(slurm) != NOTHING and time.monotonic() < deadline:  # the test's own jobs end
        time.sleep(0.5)
    assert leftovers(slurm) == NOTHING
