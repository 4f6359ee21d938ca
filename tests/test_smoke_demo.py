"""The newcomer's path: ``make demo`` (a screenful, the reason when it fails), the README's first example, and
``make dags-test`` on one's own DAG file, run through the Makefile itself against the tests' Airflow home."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from helpers import dag_bag, load_dag, run_dag, task_states, xcom

RECORD = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z \[")  # an Airflow log record
SCREEN = 40  # lines


def make(target: str, home: Path, *variables: str) -> subprocess.CompletedProcess[str]:
    """``make TARGET`` with this test's Python as the venv: its install and migration are taken as done (``-o``)."""
    venv = Path(sys.prefix)
    argv = ["make", "--no-print-directory", "-o", f"{venv}/.installed", "-o", f"{home}/.migrated"]
    return subprocess.run(
        [*argv, target, f"VENV={venv}", *variables],
        cwd=REPO,
        env={**os.environ, "AIRFLOW_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_make_demo_prints_a_short_report(airflow_home):
    done = make("demo", airflow_home, 'CONF={"epochs": 3}')
    shown = done.stdout + done.stderr
    assert done.returncode == 0, shown
    lines = shown.splitlines()
    assert len(lines) < SCREEN, shown
    assert not any(RECORD.match(line) for line in lines), shown  # Airflow's log went to the file
    assert lines[0].startswith('Running dags/gpu_training_demo.py with {"epochs": 3}')
    assert "gpu_training_demo: success in" in shown and "train success" in shown
    assert "train's profile: CPU profile (no GPU telemetry)" in shown
    assert "result (the report task's XCom): {" in shown
    assert '"device": "cpu"' in shown and '"epochs": 3' in shown
    log = airflow_home / "demo.log"
    assert str(log) in lines[0] and "[DAG TEST] starting task_id=train" in log.read_text()


def test_a_failed_demo_prints_the_reason(airflow_home):
    done = make("demo", airflow_home, 'CONF={"epochs": 1, "on_missing_gpu": "fail"}')
    shown = done.stdout + done.stderr
    assert done.returncode != 0
    assert len(shown.splitlines()) < SCREEN, shown
    assert "gpu_training_demo: failed in" in shown and "train failed, report upstream_failed" in shown
    reason = next(line for line in shown.splitlines() if line.startswith("train failed: "))
    assert reason.startswith("train failed: GpuUnavailableError: Requested 1x nvidia GPU but this host has no GPUs")
    assert "on_missing_gpu='cpu'" in reason and "'wait'" not in reason  # advice that fits a host without GPUs
    assert "metrics" not in shown


def readme_example() -> str:
    return re.search(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL)[1]


@pytest.mark.slow
def test_the_readme_example_runs_on_a_cpu_machine_with_make_dags_test(airflow_home, tmp_path):
    """As written: no GPU here, ``on_missing_gpu="cpu"`` runs it on the CPU; its requirement is installed."""
    dag_file = tmp_path / "fine_tune.py"
    dag_file.write_text(readme_example())
    done = make("dags-test", airflow_home, f"DAG={dag_file}", "DAG_ID=fine_tune")
    shown = done.stdout + done.stderr
    assert done.returncode == 0, shown[-5000:]
    assert "on_missing_gpu='cpu': running on CPU instead" in shown
    assert "[gpu] train() finished in" in shown
    assert re.search(r"Marking run <DagRun fine_tune @ .*> successful", shown), shown[-3000:]


def test_make_dags_test_names_the_dag_line_of_a_mistake(airflow_home, tmp_path):
    dag_file = tmp_path / "fine_tune.py"
    dag_file.write_text(readme_example().replace('accelerator="A100"', 'accelerator="A1000"'))
    done = make("dags-test", airflow_home, f"DAG={dag_file}", "DAG_ID=fine_tune")
    assert done.returncode != 0
    line = next(n for n, text in enumerate(dag_file.read_text().splitlines(), 1) if "@task.gpu(" in text)
    error = f"{dag_file}:{line}: @task.gpu('train'): accelerator='A1000' is invalid"
    last = done.stderr.strip().splitlines()[-3:]  # the import error last, not Airflow's "Dag ... could not be found"
    assert any(error in text for text in last), done.stderr[-3000:]
    assert re.match(r"make(\[\d+\])?: \*\*\*", last[-1]), last  # make[1] where make test called it


def test_make_dags_test_names_the_dags_of_a_file_without_the_one_asked_for(airflow_home, tmp_path):
    dag_file = tmp_path / "fine_tune.py"
    dag_file.write_text(readme_example())
    done = make("dags-test", airflow_home, f"DAG={dag_file}", "DAG_ID=fine_tuned")
    assert done.returncode != 0
    assert f"{dag_file} has no DAG 'fine_tuned'; the DAGs it defines: fine_tune" in done.stderr.strip().splitlines()[-2]


def test_make_dags_test_says_how_to_call_it(airflow_home):
    done = make("dags-test", airflow_home)
    assert done.returncode != 0
    assert "usage: make dags-test DAG=path/to/dag_file.py DAG_ID=its_dag_id" in done.stdout


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
