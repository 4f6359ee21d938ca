from __future__ import annotations

from helpers import run_dag, task_states, xcom


def test_demo_dag_trains_on_cpu_fallback(airflow_home):
    from airflow.dag_processing.dagbag import DagBag
    from conftest import REPO

    bag = DagBag(dag_folder=str(REPO / "dags" / "gpu_training_demo.py"))
    assert bag.import_errors == {}
    dag = bag.get_dag("gpu_training_demo")
    dr = run_dag(dag, conf={"epochs": 3, "gpu_count": 1, "on_missing_gpu": "cpu"})
    assert task_states(dr) == {"make_dataset": "success", "train": "success", "report": "success"}
    metrics = xcom(dr, "train")
    assert metrics["epochs"] == 3
    assert metrics["device"] == "cpu"
    assert metrics["final_loss"] < metrics["initial_loss"]
