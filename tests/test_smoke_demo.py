from __future__ import annotations

from pathlib import Path

import pytest
from helpers import dag_bag, load_dag, run_dag, task_states, xcom


@pytest.mark.smoke
def test_demo_dag_trains_on_cpu_fallback(airflow_home):
    from conftest import REPO

    bag = dag_bag(REPO / "dags" / "gpu_training_demo.py")
    assert bag.import_errors == {}
    dag = bag.get_dag("gpu_training_demo")
    dr = run_dag(dag, conf={"epochs": 3, "gpu_count": 1, "on_missing_gpu": "cpu"})
    assert task_states(dr) == {"make_dataset": "success", "train": "success", "report": "success"}
    metrics = xcom(dr, "train")
    assert metrics["epochs"] == 3
    assert metrics["device"] == "cpu"
    assert metrics["compute_dtype"] == "float32"  # mixed_precision "no"
    assert metrics["final_loss"] < metrics["initial_loss"]
    profile = xcom(dr, "train", "gpu_profile")  # no GPU here: a CPU profile of the training process
    assert profile["kind"] == "cpu" and profile["task"]["task_id"] == "train" and profile["samples"] >= 1
    assert profile["devices"][0]["peak_memory"] > 2**20 and profile["requested"]["gpu_count"] == 1
    assert xcom(dr, "make_dataset", "gpu_profile") is None  # a plain @task is not a GPU task


@pytest.mark.gpu
def test_demo_dag_trains_on_the_gpu_in_bf16(airflow_home, real_gpus):
    demo = Path(__file__).resolve().parents[1] / "dags" / "gpu_training_demo.py"
    dag = load_dag(demo, "gpu_training_demo")
    dr = run_dag(dag, conf={"epochs": 3, "gpu_count": 1, "mixed_precision": "bf16", "on_missing_gpu": "fail"})
    assert task_states(dr) == {"make_dataset": "success", "train": "success", "report": "success"}
    metrics = xcom(dr, "train")
    assert metrics["device"].startswith("cuda")
    assert metrics["compute_dtype"] == "bfloat16"  # the forward pass really ran in bf16
    assert metrics["gpu_name"]
    assert metrics["final_loss"] < metrics["initial_loss"]
    profile = xcom(dr, "train", "gpu_profile")  # NVML through ctypes, on the GPU the task was given
    assert profile["kind"] == "gpu" and len(profile["devices"]) == 1 and profile["devices"][0]["uuid"] in real_gpus
    assert profile["devices"][0]["name"] == metrics["gpu_name"] and profile["devices"][0]["peak_memory"] > 0


def test_make_demo_script_runs_the_demo_and_prints_the_result(airflow_home):
    """``make demo``'s script, as the README's first command runs it: the profile's summary and the result."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve().parents[1] / "scripts" / "demo.py"), '{"epochs": 2}'],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert "=== the train task's profile (XCom key gpu_profile) ===" in done.stdout
    assert "profile: CPU profile (no GPU telemetry)" in done.stdout
    assert '"state": "success"' in done.stdout and '"metrics": {' in done.stdout
