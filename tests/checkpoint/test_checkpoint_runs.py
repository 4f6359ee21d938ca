"""Checkpoint and resume for real: trainings interrupted on try 1 resume on try 2 (dag.test() runs the retry)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from conftest import REPO
from helpers import alive, load_dag, run_dag, task_states, xcom

from airflow_gpu_provider.checkpoint.location import location

pytestmark = pytest.mark.usefixtures("airflow_home")
DAG_FILE = REPO / "tests" / "dags" / "checkpoint_dags.py"


def _try_numbers(dag_run) -> dict[str, int]:
    from airflow.utils.session import create_session

    with create_session() as session:
        return {ti.task_id: ti.try_number for ti in dag_run.get_task_instances(session=session)}


@pytest.fixture(autouse=True)
def allowed_roots(tmp_path, monkeypatch):
    """The deployment allows the test's folder as a checkpoint root, as a path and as a file:// URI (policy/)."""
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_CHECKPOINT_ROOTS", f"{tmp_path}, file://{tmp_path}")


def test_plain_loop_resumes_at_epoch_3_and_ends_as_an_uninterrupted_run(tmp_path, capfd):
    dr = run_dag(load_dag(DAG_FILE, "checkpoint_plain"), conf={"root": str(tmp_path)})
    assert task_states(dr) == {"interrupted": "success", "uninterrupted": "success"}
    assert _try_numbers(dr) == {"interrupted": 2, "uninterrupted": 1}
    resumed, reference = xcom(dr, "interrupted"), xcom(dr, "uninterrupted")
    assert resumed["started_at"] == 3 and reference["started_at"] == 0
    torch.testing.assert_close(torch.tensor(resumed["weights"]), torch.tensor(reference["weights"]), rtol=0, atol=0)
    labels = {"dag_id": dr.dag_id, "run_id": dr.run_id, "task_id": "interrupted", "map_index": "-1"}
    assert resumed["folder"] == location(str(tmp_path), labels).path  # the same folder for both tries
    assert resumed["folder"] != reference["folder"]
    assert not (tmp_path / dr.dag_id).exists() or not any((tmp_path / dr.dag_id).iterdir())  # the run succeeded
    assert "RuntimeError: interrupted at epoch 3" in capfd.readouterr().out


def test_two_process_accelerate_launch_resumes_from_its_newest_save_state(tmp_path, capfd):
    dr = run_dag(load_dag(DAG_FILE, "checkpoint_accelerate"), conf={"root": str(tmp_path)})
    assert task_states(dr) == {"interrupted": "success", "uninterrupted": "success"}
    assert _try_numbers(dr) == {"interrupted": 2, "uninterrupted": 1}
    resumed, reference = xcom(dr, "interrupted"), xcom(dr, "uninterrupted")
    assert resumed["world_size"] == reference["world_size"] == 2
    assert resumed["started_at"] == 3 and resumed["resume_step"] == "2"
    assert reference["started_at"] == 0 and reference["resume_step"] is None
    assert resumed["checkpoints"] == reference["checkpoints"] == [f"checkpoint_{i}" for i in range(6)]
    torch.testing.assert_close(torch.tensor(resumed["weights"]), torch.tensor(reference["weights"]))
    out = capfd.readouterr().out
    assert (
        "checkpoint_2 (step 2; an accelerator.save_state checkpoint, in AIRFLOW_GPU_RESUME_FROM): loaded after" in out
    )
    assert "rank 1: resumed from" in out and "rank 0: resumed from" in out
    assert "resume: no checkpoint in" in out  # try 1, and the uninterrupted task


def test_a_uri_root_is_staged_downloaded_and_uploaded_around_save_state(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU__CHECKPOINT_CLEANUP", "False")  # to look at the store after the run
    dr = run_dag(load_dag(DAG_FILE, "checkpoint_accelerate_uri"), conf={"root": str(tmp_path)})
    assert task_states(dr) == {"interrupted": "success", "uninterrupted": "success"}
    assert _try_numbers(dr) == {"interrupted": 2, "uninterrupted": 1}
    resumed, reference = xcom(dr, "interrupted"), xcom(dr, "uninterrupted")
    assert resumed["world_size"] == 2 and resumed["started_at"] == 3 and resumed["resume_step"] == "2"
    torch.testing.assert_close(torch.tensor(resumed["weights"]), torch.tensor(reference["weights"]))
    labels = {"dag_id": dr.dag_id, "run_id": dr.run_id, "task_id": "interrupted", "map_index": "-1"}
    uri = location(f"file://{tmp_path}", labels).path
    assert resumed["uri"] == uri
    assert resumed["checkpoints"] == [f"checkpoint_{i}" for i in range(2, 6)]  # only the newest was downloaded
    for task_id in ("interrupted", "uninterrupted"):
        stored = Path(location(str(tmp_path), {**labels, "task_id": task_id}).path, "checkpoints")
        assert sorted(p.name for p in stored.iterdir()) == [f"checkpoint_{i}" for i in range(6)]  # every save, uploaded
        assert (stored / "checkpoint_5" / "random_states_1.pkl").is_file()  # rank 1's files too
    assert not Path(resumed["folder"]).exists() and not Path(reference["folder"]).exists()  # the local copies
    out = capfd.readouterr().out
    assert f"resume: downloaded {uri}/checkpoints/checkpoint_2" in out


def test_sigterm_reaches_the_task_which_saves_within_the_grace_period(tmp_path):
    started = time.monotonic()
    dr = run_dag(load_dag(DAG_FILE, "checkpoint_grace"), conf={"root": str(tmp_path)})
    assert task_states(dr) == {"graceful": "failed"}  # its execution_timeout
    assert time.monotonic() - started < 60  # not the 120 s it would sleep
    labels = {"dag_id": dr.dag_id, "run_id": dr.run_id, "task_id": "graceful", "map_index": "-1"}
    folder = location(str(tmp_path), labels).path
    assert (tmp_path / folder / "last.txt").read_text() == "saved on signal 15"
    assert not alive(int((tmp_path / folder / "pid").read_text()))


def test_a_successful_run_deletes_its_checkpoints_a_failed_one_keeps_them(tmp_path, monkeypatch):
    conf = {"root": str(tmp_path / "local"), "uri": f"file://{tmp_path}/objects", "fail": False}
    dag = load_dag(DAG_FILE, "checkpoint_cleanup")
    dr = run_dag(dag, conf=conf)
    assert task_states(dr) == {"local_root": "success", "uri_root": "success"}
    local, uri = xcom(dr, "local_root"), xcom(dr, "uri_root")
    assert local.startswith(str(tmp_path / "local")) and uri.startswith(f"file://{tmp_path}/objects/")
    assert not Path(local).exists() and not Path(uri.removeprefix("file://")).exists()
    assert not Path(local).parent.exists()  # the run's folder, not only the task's
    assert (tmp_path / "local" / "checkpoint_cleanup").is_dir()  # other runs' folders stay

    failed = run_dag(dag, conf={**conf, "fail": True})
    assert task_states(failed) == {"local_root": "success", "uri_root": "failed"}
    labels = {"dag_id": failed.dag_id, "run_id": failed.run_id, "map_index": "-1"}
    assert Path(location(conf["root"], {**labels, "task_id": "local_root"}).path, "state.txt").is_file()
    kept = location(str(tmp_path / "objects"), {**labels, "task_id": "uri_root"}).path
    assert Path(kept, "state.txt").read_text() == "state"

    monkeypatch.setenv("AIRFLOW__GPU__CHECKPOINT_CLEANUP", "False")
    kept_by_config = run_dag(dag, conf=conf)
    assert task_states(kept_by_config) == {"local_root": "success", "uri_root": "success"}
    assert Path(xcom(kept_by_config, "local_root"), "state.txt").is_file()


def test_the_example_dag_fails_on_purpose_and_its_retry_resumes(capfd):
    conf = {"epochs": 4, "fail_at_epoch": 2, "gpu_count": 2, "on_missing_gpu": "cpu", "mixed_precision": "no"}
    dr = run_dag(load_dag(REPO / "dags" / "resilient_training.py", "resilient_training"), conf=conf)
    assert task_states(dr) == {"train": "success", "report": "success"}
    assert _try_numbers(dr)["train"] == 2
    metrics = xcom(dr, "train")
    assert metrics["world_size"] == 2 and metrics["started_at_epoch"] == 2 and len(metrics["loss_curve"]) == 2
    assert metrics["memory"] == 16 * 2**30  # try 1 ran out of host memory (on purpose): try 2 got on_oom's next step
    tries = xcom(dr, "train", "gpu_escalation")["tries"]
    assert [(t["kind"], t["resources"]["memory"]) for t in tries] == [("host_oom", 8 * 2**30), ("success", 16 * 2**30)]
    captured = capfd.readouterr()
    out, log = captured.out, captured.out + captured.err
    assert "failing on purpose at epoch 2" in out and "(step 1; an accelerator.save_state checkpoint, in " in out
    assert "memory step 1/1: 2x nvidia GPU, 2 CPUs, 16.0 GiB memory, 2.0 GiB shm (try 1 ran out of host memory)" in log
