"""The Edge executor for real: ``apache-airflow-providers-edge3``, an edge worker on queue ``gpu`` against the local API
server, next to LocalExecutor (``[core] executor = LocalExecutor,...EdgeExecutor``, ``[gpu] executor = EdgeExecutor``).

The same DAG file as the Celery test: its GPU task goes to the Edge executor's ``gpu`` queue and runs on the edge
worker (started with a marker in its environment), like the local backend; the plain task stays on LocalExecutor.
"""

from __future__ import annotations

import shutil

import pytest
from cluster import AIRFLOW, Cluster
from conftest import REPO

pytest.importorskip("airflow.providers.edge3", reason="the Edge provider is not installed (the dev extra has it)")
pytestmark = pytest.mark.slow
EDGE = "airflow.providers.edge3.executors.EdgeExecutor"


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
            "AIRFLOW__CORE__EXECUTOR": f"LocalExecutor,{EDGE}",
            "AIRFLOW__GPU__EXECUTOR": "EdgeExecutor",
            "AIRFLOW__GPU__DEVICES": "none",
            "AIRFLOW__EDGE__API_ENABLED": "True",
            "AIRFLOW__EDGE__JOB_POLL_INTERVAL": "1",
            "AIRFLOW__EDGE__HEARTBEAT_INTERVAL": "5",
            "AIRFLOW__CORE__PARALLELISM": "4",
        },
    )
    cluster.env["AIRFLOW__EDGE__API_URL"] = f"http://localhost:{cluster.api_port}/edge_worker/v1/rpcapi"
    try:
        cluster.start_airflow()
        cluster.start(
            "edge-worker",
            [*AIRFLOW, "edge", "worker", "-q", "gpu", "--concurrency", "1", "--edge-hostname", "gpu-box"],
            AIRFLOW_GPU_TEST_WORKER="edge-gpu",
            AIRFLOW__GPU__DEVICES="0",
        )
        yield cluster
    finally:
        leftovers = cluster.stop()
        assert leftovers == [], leftovers


def test_the_gpu_task_runs_on_the_edge_worker(cluster):
    tis = cluster.trigger_and_wait("executor_gpu", "edge_run")
    assert (tis["train"]["queue"], tis["train"]["executor"]) == ("gpu", EDGE)
    assert (tis["prepare"]["queue"], tis["prepare"]["executor"]) == ("default", None)
    assert cluster.xcom("executor_gpu", "edge_run", "train") == {"worker": "edge-gpu", "cuda_visible_devices": "0"}
    assert cluster.xcom("executor_gpu", "edge_run", "prepare")["worker"] == "?"  # LocalExecutor, in the scheduler
    # the Edge executor's own record: which edge worker took the job (its state follows the worker's next report)
    assert cluster.query("SELECT queue, edge_worker FROM edge_job WHERE task_id = 'train'") == [("gpu", "gpu-box")]
