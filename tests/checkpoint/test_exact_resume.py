"""Exact resume for the training code people write: shuffled loaders, AdamW, schedulers, killed in the middle.

Try 1 of each interrupted task ends with ``os._exit`` in the middle of the training (no cleanup, no result); Airflow
retries it (dag.test() runs the retry), and try 2 resumes from the newest checkpoint. Its final weights must be the
same bytes as those of the same training run uninterrupted with the same seed.
"""

from __future__ import annotations

import json
import re

import pytest
from conftest import REPO
from helpers import load_dag, run_dag, task_states, xcom

pytestmark = pytest.mark.usefixtures("airflow_home")
DAG_FILE = REPO / "tests" / "dags" / "resume_dags.py"


@pytest.fixture(autouse=True)
def allowed_roots(tmp_path, monkeypatch):
    """The deployment allows the test's folder as a checkpoint root; the checkpoints stay to be looked at."""
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_CHECKPOINT_ROOTS", str(tmp_path))
    monkeypatch.setenv("AIRFLOW__GPU__CHECKPOINT_CLEANUP", "False")


def _tries(dag_run) -> dict[str, int]:
    from airflow.utils.session import create_session

    with create_session() as session:
        return {ti.task_id: ti.try_number for ti in dag_run.get_task_instances(session=session)}


def test_a_function_with_shuffled_loaders_adamw_and_a_warmup_schedule_resumes_exactly(tmp_path, capfd):
    dr = run_dag(load_dag(DAG_FILE, "resume_function"), conf={"root": str(tmp_path)})
    assert task_states(dr) == {"interrupted": "success", "uninterrupted": "success"}
    assert _tries(dr) == {"interrupted": 2, "uninterrupted": 1}
    resumed, reference = xcom(dr, "interrupted"), xcom(dr, "uninterrupted")
    assert resumed["world_size"] == reference["world_size"] == 2
    assert (resumed["started_at"], reference["started_at"]) == (2, 0)
    assert resumed["sha256"] == reference["sha256"], (resumed["weight_sum"], reference["weight_sum"])
    assert resumed["accuracy"] == reference["accuracy"][2:]  # the evaluations after the resume, too
    assert resumed["checkpoints"] == reference["checkpoints"] == [f"checkpoint_{i}" for i in range(4)]
    out = capfd.readouterr().out
    assert "killed at epoch 2" in out
    assert (
        "(step 1; an accelerator.save_state checkpoint, in AIRFLOW_GPU_RESUME_FROM): loaded after the function's" in out
    )
    for rank in (0, 1):
        assert f"rank {rank}: resumed from " in out
    assert "2 dataloader(s) at their saved pass and shuffling state; the next save is checkpoint_2" in out


def test_an_accelerate_script_resumes_exactly_with_the_helper_and_saves_on(tmp_path, capfd):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    dr = run_dag(load_dag(DAG_FILE, "resume_script"), conf={"root": str(tmp_path), "out": str(out_dir)})
    assert task_states(dr) == {"interrupted": "success", "uninterrupted": "success"}
    assert _tries(dr) == {"interrupted": 2, "uninterrupted": 1}
    resumed = json.loads((out_dir / "interrupted.json").read_text())
    reference = json.loads((out_dir / "uninterrupted.json").read_text())
    assert resumed["world_size"] == reference["world_size"] == 2
    assert (resumed["resumed_from"], resumed["started_at"]) == ("checkpoint_1", 2)
    assert (reference["resumed_from"], reference["started_at"]) == (None, 0)
    # automatic naming goes on after the resume: three saves, no "checkpoint_0 already exists"
    assert resumed["saved"] == ["checkpoint_2", "checkpoint_3", "checkpoint_4"]
    assert resumed["checkpoints"] == reference["checkpoints"] == [f"checkpoint_{i}" for i in range(5)]
    assert resumed["sha256"] == reference["sha256"], (resumed["weight_sum"], reference["weight_sum"])
    out = capfd.readouterr().out
    assert "killed at epoch 2" in out
    assert (
        "(step 1; an accelerator.save_state checkpoint, in AIRFLOW_GPU_RESUME_FROM): the script loads it: "
        "airflow_gpu_runtime.resume(accelerator)" in out
    )
    assert "loaded after the function's first accelerator.prepare()" not in out  # nothing claims what does not happen
    assert "rank 1: resumed from " in out and "the next save is checkpoint_2" in out


def test_a_script_saving_steps_and_epochs_resumes_exactly_from_the_one_written_last(tmp_path, capfd):
    """accelerate's complete_cv_example checkpointing both ways; killed right after epoch_1, with step_6 beside it."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    dr = run_dag(load_dag(DAG_FILE, "resume_steps_and_epochs"), conf={"root": str(tmp_path), "out": str(out_dir)})
    assert task_states(dr) == {"interrupted": "success", "uninterrupted": "success"}
    assert _tries(dr) == {"interrupted": 2, "uninterrupted": 1}
    resumed = json.loads((out_dir / "interrupted.json").read_text())
    reference = json.loads((out_dir / "uninterrupted.json").read_text())
    assert (resumed["resumed_from"], resumed["started_at"]) == ("epoch_1", 2)
    assert resumed["checkpoints"] == reference["checkpoints"]
    assert {"step_6", "epoch_1", "step_12", "epoch_2"} <= set(reference["checkpoints"])
    assert resumed["sha256"] == reference["sha256"]
    out = capfd.readouterr().out
    assert "killed after saving epoch_1" in out
    assert "/epoch_1 (epoch 1; an accelerator.save_state checkpoint, in AIRFLOW_GPU_RESUME_FROM)" in out


def test_a_trainer_resumes_from_its_newest_checkpoint_n_exactly(capfd):
    """The example DAG: a tiny random GPT-2, transformers installed from ImageSettings, killed after step 10."""
    dag = load_dag(REPO / "dags" / "trainer_resume.py", "trainer_resume")
    conf = {"epochs": 2, "batch_size": 4, "save_steps": 5, "on_missing_gpu": "cpu"}
    reference_run = run_dag(dag, conf={**conf, "fail_at_step": -1})
    fresh = capfd.readouterr().out
    resumed_run = run_dag(dag, conf={**conf, "fail_at_step": 10})
    out = capfd.readouterr().out
    assert task_states(reference_run) == task_states(resumed_run) == {"train": "success", "report": "success"}
    assert (_tries(reference_run)["train"], _tries(resumed_run)["train"]) == (1, 2)
    reference, resumed = xcom(reference_run, "train"), xcom(resumed_run, "train")
    assert (reference["started_at_step"], resumed["started_at_step"]) == (0, 10)
    assert reference["global_step"] == resumed["global_step"] == 24
    assert resumed["weights_sha256"] == reference["weights_sha256"]
    assert "resume: no checkpoint in" in fresh  # a fresh start says so...
    assert "killed on purpose after saving step 10" in out
    resumed_log = out.split("killed on purpose", 1)[1]
    assert "starts afresh" not in resumed_log  # ...and a retry with a checkpoint never does
    assert "/checkpoint-10 (step 10; a Trainer checkpoint, in AIRFLOW_GPU_RESUME_FROM): pass it on" in resumed_log


@pytest.mark.slow
def test_a_lightning_ddp_training_whose_rank_was_killed_resumes_from_last_ckpt(tmp_path, capfd):
    """Rank 1 of Lightning's ``ddp`` is SIGKILLed at epoch 2 of try 1; Lightning then kills rank 0 (the task process).
    The try's failure names rank 1; try 2 resumes from ``last.ckpt`` and ends with the uninterrupted run's weights."""
    dag = load_dag(REPO / "tests" / "dags" / "lightning_dags.py", "lightning_resume")
    dr = run_dag(dag, conf={"root": str(tmp_path)})
    out = "".join(capfd.readouterr())
    assert task_states(dr) == {"interrupted": "success", "uninterrupted": "success"}, out[-5000:]
    assert _tries(dr) == {"interrupted": 2, "uninterrupted": 1}
    resumed, reference = xcom(dr, "interrupted"), xcom(dr, "uninterrupted")
    assert (resumed["resumed_from"], reference["resumed_from"]) == ("last.ckpt", None)
    assert resumed["sha256"] == reference["sha256"]
    assert "[rank 1] rank 1 killed at epoch 2" in out
    killed = re.search(r"\[gpu\] rank 1 \(pid (\d+)\) was killed by SIGKILL, the first rank to fail", out)
    assert killed, "\n".join(line for line in out.splitlines() if "SIGKILL" in line or "exited with" in line)
    # the try's error names it first, whether Lightning killed rank 0 or rank 0 failed on the broken connection
    failed = (
        rf"The task (failed|raised \w+) in the local task process: rank 1 \(pid {killed[1]}\) was killed by SIGKILL"
    )
    assert re.search(failed, out), "\n".join(line for line in out.splitlines() if "The task" in line)
    assert re.search(
        r"resume: from \S+/last\.ckpt \(a Lightning checkpoint, in AIRFLOW_GPU_RESUME_FROM\): pass it "
        r"on: trainer\.fit\(model, ckpt_path=os\.environ\.get\('AIRFLOW_GPU_RESUME_FROM'\)\)",
        out,
    )
