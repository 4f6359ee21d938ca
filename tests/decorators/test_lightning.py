"""PyTorch Lightning inside @task.gpu, for real: lightning installed as an injected requirement (a venv over the
worker's torch), ``strategy="ddp"`` on 2 CPU devices, whose other rank runs the task process again, and
``ddp_spawn`` with its model in a module next to the DAG file.
"""

from __future__ import annotations

import re

import pytest
from conftest import REPO
from helpers import alive, load_dag, run_dag, task_states, xcom

DAG_FILE = REPO / "tests" / "dags" / "lightning_dags.py"
pytestmark = pytest.mark.slow


def test_lightning_ddp_and_ddp_spawn_on_two_cpu_devices(airflow_home, capfd):
    dag_run = run_dag(load_dag(DAG_FILE, "lightning_ddp"))
    out = capfd.readouterr().out
    assert task_states(dag_run) == {"ddp": "success", "ddp_spawn": "success"}, out[-5000:]

    ddp = xcom(dag_run, "ddp")
    assert ddp["global_rank"] == 0  # rank 0's return value, not rank 1's
    assert ddp["world_size"] == ddp["process_group_size"] == 2  # the process group really spans 2 processes
    assert len(set(ddp["pids"])) == 2 and ddp["pid"] in ddp["pids"]
    rank_1 = next(pid for pid in ddp["pids"] if pid != ddp["pid"])
    assert not alive(rank_1)

    ddp_log = out[: out.index("[gpu] train_ddp() finished")]
    ddp_log = ddp_log[ddp_log.rindex("[gpu] backend=local") :]  # the ddp task's log
    assert ddp_log.count("[gpu] backend=local") == 1  # one summary: rank 1 printed none
    assert re.search(rf"\[gpu\] rank 1 \(pid {rank_1}\): a copy of the task process started by the task's code "
                     r"\(LOCAL_RANK=1 WORLD_SIZE=2\); rank 0 reports the result", ddp_log)  # fmt: skip
    assert "[gpu] rank 1: train_ddp() finished" in out  # rank 1 ended by itself ...
    assert "killed with" not in out  # ... so no rank was killed, and none silently
    assert out.count("profile: CPU profile of the task's processes") == 2  # one sampler per task, not per rank

    spawn = xcom(dag_run, "ddp_spawn")
    assert spawn["world_size"] == 2 and spawn["loss"] >= 0
