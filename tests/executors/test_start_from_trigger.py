"""Start from the triggerer for real: a task that must wait for GPUs holds no worker slot until they are free.

A real scheduler (LocalExecutor), DAG processor, API server and ``airflow triggerer`` (no trigger queues, so the start
trigger, which Airflow creates without one, runs there). The host lists one GPU, which the test holds. The task
(``on_missing_gpu="wait"``, ``deferrable=True``) goes from the scheduler straight to the triggerer
(``start_from_trigger``, :class:`~airflow_gpu_provider.host.trigger.GpuStartTrigger`): while the GPU is held it is
``deferred`` and no LocalExecutor worker process names it (a worker's title is ``airflow worker -- LocalExecutor:
<task instance id>`` while it supervises one); once the test lets the GPU go, a worker runs it on that GPU.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from cluster import AIRFLOW, Cluster
from conftest import REPO

from airflow_gpu_provider.host.allocator import GpuAllocator
from airflow_gpu_provider.host.inventory import Device

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
DAG_ID = "sched_start_from_trigger"
WORKER = "airflow worker -- LocalExecutor:"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    dags, home = tmp_path / "dags", tmp_path / "home"
    dags.mkdir()
    home.mkdir()
    shutil.copy(REPO / "tests" / "dags" / "start_from_trigger_dags.py", dags)
    cluster = Cluster(
        home,
        dags,
        {
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "2",
            "AIRFLOW__GPU__DEVICES": "0",  # no real GPU here: the allocator hands out the listed one
            "AIRFLOW__GPU__POLL_INTERVAL": "0.5",
        },
    )
    try:
        cluster.start_airflow()
        cluster.start("triggerer", [*AIRFLOW, "triggerer"])
        yield cluster
    finally:
        leftovers = cluster.stop()
        assert leftovers == [], leftovers


def workers_naming(ti_id: str) -> list[int]:
    """The LocalExecutor worker processes that supervise the task instance ``ti_id`` now."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        title = " ".join(process.info["cmdline"] or [])
        if title.startswith(WORKER) and title[len(WORKER) :].strip().replace("-", "") == ti_id.replace("-", ""):
            found.append(process.info["pid"])
    return found


def test_a_task_waiting_for_a_held_gpu_takes_no_worker_until_it_is_free(cluster):
    held = GpuAllocator(cluster.home / "gpu-state" / "locks").try_acquire([Device("0")], 1, "the test's other job")
    assert held is not None
    released = None
    try:
        cluster.wait_for_dag(DAG_ID)
        cluster.trigger(DAG_ID, "r1")
        looks: list[dict] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len([look for look in looks if look["state"] == "deferred"]) < 20:
            rows = cluster.query(
                'SELECT ti.id, ti.state, t.classpath FROM task_instance ti LEFT JOIN "trigger" t '
                "ON ti.trigger_id = t.id WHERE ti.dag_id = ? AND ti.run_id = ?",
                DAG_ID,
                "r1",
            )
            if rows:
                ti_id, state, trigger = rows[0]
                looks.append({"state": state, "trigger": trigger, "workers": workers_naming(str(ti_id))})
            time.sleep(0.3)
    finally:
        released = time.time()
        held.release()
    deferred = [look for look in looks if look["state"] == "deferred"]
    assert len(deferred) >= 20, f"{looks}\n{cluster.logs()}"  # 6 s and more of it, seen every 0.3 s
    # from the scheduler straight to the triggerer: never queued or running, no worker ever named it
    assert {look["state"] for look in looks} <= {None, "scheduled", "deferred"}, looks
    assert all(look["workers"] == [] for look in looks), looks
    assert {look["trigger"] for look in deferred} == {"airflow_gpu_provider.host.trigger.GpuStartTrigger"}, looks

    state = cluster.wait_for_run(DAG_ID, "r1", timeout=120)
    assert state == "success", f"{cluster.task_instances(DAG_ID, 'r1')}\n{cluster.logs()}"
    result = cluster.xcom(DAG_ID, "r1", "waits")
    assert result["gpu"] == "0" and result["started"] >= released, result  # on the GPU, once it was let go
    logs = "".join(p.read_text(errors="replace") for p in (cluster.home / "logs").rglob(f"dag_id={DAG_ID}/**/*.log*"))
    assert "Started in the triggerer: waiting for 1x nvidia GPU" in logs, logs[-3000:]
    assert "GPUs free after" in logs, logs[-3000:]
