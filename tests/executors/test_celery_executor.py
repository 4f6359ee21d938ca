"""CeleryExecutor for real: Redis, the Celery provider, a scheduler and two workers (queues ``default`` and ``gpu``).

The DAG of tests/dags/executor_dags.py is parsed by a real DAG processor with ``[core] executor = CeleryExecutor``:
its GPU task (executor backend) lands on the ``gpu`` worker, which runs it like the local backend (allocator,
``CUDA_VISIBLE_DEVICES``), and the plain task on the ``default`` worker. The GPU pool ``gpu`` comes from
``[gpu] pool = {queue}`` and ``[gpu] inventory``, created by the provider's listener when the scheduler starts.
"""

from __future__ import annotations

import shutil

import pytest
from cluster import AIRFLOW, Cluster
from conftest import REPO

pytest.importorskip("airflow.providers.celery", reason="the Celery provider is not installed (the dev extra has it)")
pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path):
    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(REPO / "tests" / "dags" / "executor_dags.py", dags)
    home = tmp_path / "home"
    home.mkdir()
    cluster = Cluster(
        home,
        dags,
        {
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__GPU__BACKEND": "local",
            "AIRFLOW__GPU__POOL": "{queue}",
            "AIRFLOW__GPU__INVENTORY": "*=1",
            "AIRFLOW__GPU__DEVICES": "none",
        },
    )
    try:
        broker = cluster.start_redis()
        cluster.env["AIRFLOW__CELERY__BROKER_URL"] = f"{broker}/0"
        cluster.env["AIRFLOW__CELERY__RESULT_BACKEND"] = f"redis://{broker.split('://')[1]}/1"
        cluster.start_airflow()
        for queue, devices in (("default", "none"), ("gpu", "0")):
            cluster.start(
                f"worker-{queue}",
                [*AIRFLOW, "celery", "worker", "-q", queue, "--concurrency", "2", "--skip-serve-logs",
                 "--celery-hostname", f"{queue}@%h"],
                AIRFLOW_GPU_TEST_WORKER=queue,  # the marker each task reports
                AIRFLOW__GPU__DEVICES=devices,
            )  # fmt: skip
        yield cluster
    finally:
        leftovers = cluster.stop()
        assert leftovers == [], leftovers


def test_the_gpu_task_runs_on_the_gpu_worker_and_the_plain_task_on_default(cluster):
    tis = cluster.trigger_and_wait("executor_gpu", "celery_run")
    assert tis["train"]["queue"] == "gpu" and tis["train"]["pool"] == "gpu"
    assert tis["prepare"]["queue"] == "default" and tis["prepare"]["pool"] == "default_pool"
    assert cluster.xcom("executor_gpu", "celery_run", "train") == {"worker": "gpu", "cuda_visible_devices": "0"}
    assert cluster.xcom("executor_gpu", "celery_run", "prepare")["worker"] == "default"
    assert cluster.query("SELECT slots FROM slot_pool WHERE pool = 'gpu'") == [(1,)]  # made at scheduler start
    # the provider's listeners in a real scheduler: the checkpoint cleanup ran, and the scheduler lives on
    scheduler_log = (cluster.home / "scheduler.log").read_text(errors="replace")
    assert "Deleted the checkpoints of successful run celery_run" in scheduler_log
    assert "Error while calling listener" not in scheduler_log
    assert cluster.processes["scheduler"].poll() is None
