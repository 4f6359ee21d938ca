"""Checkpoint roots only from the admin's list; folders made and deleted without trusting a name (H1, H4)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from airflow.sdk import DAG

from airflow_gpu_provider import GpuStepOperator
from airflow_gpu_provider.backends import BACKENDS
from airflow_gpu_provider.checkpoint.cleanup import remove_run_folder
from airflow_gpu_provider.checkpoint.location import location
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.policy import Policy, PolicyError
from airflow_gpu_provider.policy.paths import UnsafePathError
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.request import TaskRequest

OTHER_USER = 1000


def work() -> int:
    return 1


def test_h1_a_dag_author_cannot_name_a_folder_the_scheduler_would_delete(tmp_path, monkeypatch):
    """H1: dag_id 'airflow', checkpoint '<dir>/opt', run id 'logs' deleted <dir>/opt/airflow/logs from the scheduler."""
    unrelated = tmp_path / "opt" / "airflow" / "logs"
    unrelated.mkdir(parents=True)
    (unrelated / "scheduler.log").write_text("not a checkpoint")
    with DAG("airflow", schedule=None), pytest.raises(PolicyError, match="allowed_checkpoint_roots"):
        GpuStepOperator(task_id="t", python_callable=work, checkpoint=str(tmp_path / "opt"))
    # the scheduler's cleanup takes no root the admin did not list, whatever a (templated) field rendered to
    assert remove_run_folder(str(tmp_path / "opt"), "airflow", "logs", Policy.current()) is False
    # and in an allowed root, only a folder the provider made and marked for that very run
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_CHECKPOINT_ROOTS", str(tmp_path / "opt"))
    with pytest.raises(UnsafePathError, match="no marker of the provider"):
        remove_run_folder(str(tmp_path / "opt"), "airflow", "logs", Policy.current())
    assert (unrelated / "scheduler.log").read_text() == "not a checkpoint"


def test_h1_a_uri_root_is_deleted_only_under_an_allowed_prefix_and_when_the_provider_made_it(tmp_path, monkeypatch):
    store = tmp_path / "bucket" / "airflow" / "logs"
    store.mkdir(parents=True)
    (store / "x").write_text("y")
    assert remove_run_folder(f"file://{tmp_path}/bucket", "airflow", "logs", Policy.current()) is False
    assert (store / "x").exists()
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_CHECKPOINT_ROOTS", f"file://{tmp_path}/bucket")
    with pytest.raises(UnsafePathError, match="no marker of the provider"):  # M1: a file:// root is a path
        remove_run_folder(f"file://{tmp_path}/bucket", "airflow", "logs", Policy.current())
    assert (store / "x").exists()
    labels = {"dag_id": "airflow", "run_id": "logs", "task_id": "t", "map_index": "-1"}
    location(f"file://{tmp_path}/bucket", labels).make(labels)  # what the worker does when a try starts
    assert remove_run_folder(f"file://{tmp_path}/bucket", "airflow", "logs", Policy.current()) is True
    assert not store.exists()


@pytest.mark.parametrize(
    "root",
    [
        "s3://ml/ckpt/../victim",
        "s3://ml/ckpt/%2e%2e/victim",
        "s3://ml/ckpt/%2E%2e",
        "s3://ml/ckpt/./team",
        "s3://ml/ckpt//team",
        "s3://ml/ckpt/team?versionId=1",
        "s3://ml/ckpt/team#x",
        "S3://ml/ckpt/../../etc",
        "file://{tmp}/ckpt/../victim",
        "file://{tmp}/ckpt/%2e%2e/victim",
        "file://otherhost{tmp}/ckpt",
    ],
)
def test_m1_a_uri_root_is_compared_by_its_components_and_never_climbs_out(root, tmp_path, monkeypatch):
    """M1: 's3://ml/ckpt/../victim' passed the allow-list (a string prefix) and cleanup deleted victim/<dag>/<run>."""
    root = root.format(tmp=tmp_path)
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_CHECKPOINT_ROOTS", f"s3://ml/ckpt, file://{tmp_path}/ckpt")
    with DAG("climbing", schedule=None), pytest.raises(InvalidSettingError, match=r"checkpoint=.* is invalid"):
        GpuStepOperator(task_id="t", python_callable=work, checkpoint=root)
    victim = tmp_path / "victim" / "climbing" / "r1"
    victim.mkdir(parents=True)
    # the scheduler's cleanup takes the rendered (templated) root as it is: nothing outside the allowed root goes
    assert remove_run_folder(root, "climbing", "r1", Policy.current()) is False
    assert victim.is_dir()


def test_m1_a_file_uri_and_its_path_are_the_same_root(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_CHECKPOINT_ROOTS", f"{tmp_path}/a, file://{tmp_path}/b")
    with DAG("file_roots", schedule=None):
        GpuStepOperator(task_id="a", python_callable=work, checkpoint=f"file://{tmp_path}/a/team")
        GpuStepOperator(task_id="b", python_callable=work, checkpoint=f"{tmp_path}/b/team")
        GpuStepOperator(task_id="c", python_callable=work, checkpoint=f"file://localhost{tmp_path}/b")
        with pytest.raises(PolicyError, match="allowed_checkpoint_roots"):
            GpuStepOperator(task_id="d", python_callable=work, checkpoint=f"file://{tmp_path}/bb")


def test_m1_an_object_store_run_folder_is_deleted_only_with_the_providers_marker(monkeypatch):
    """A bucket prefix is deleted only when the worker marked it for that very run (memory:// stands in for s3://)."""
    from airflow.sdk import ObjectStoragePath

    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_CHECKPOINT_ROOTS", "memory://ml/ckpt")
    labels = {"dag_id": "train", "run_id": "r1", "task_id": "fit", "map_index": "-1"}
    theirs = ObjectStoragePath("memory://ml/ckpt/train/r2/data.bin")
    theirs.parent.mkdir(parents=True, exist_ok=True)
    theirs.write_text("not the provider's")
    with pytest.raises(UnsafePathError, match="no marker of the provider"):  # not the provider's: kept
        remove_run_folder("memory://ml/ckpt", "train", "r2", Policy.current())
    assert theirs.read_text() == "not the provider's"
    location("memory://ml/ckpt", labels).make(labels)  # the worker marks the run folder when a try starts
    ObjectStoragePath(location("memory://ml/ckpt", labels).path, "state.txt").write_text("state")
    marker = ObjectStoragePath("memory://ml/ckpt/train/r1/.airflow-gpu-provider")
    assert json.loads(marker.read_text()) == {"dag_id": "train", "run_id": "r1"}
    assert remove_run_folder("memory://ml/ckpt", "train", "r1", Policy.current()) is True
    assert not ObjectStoragePath("memory://ml/ckpt/train/r1").exists() and theirs.exists()


def test_a_root_of_the_allow_list_is_accepted_at_parse(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_CHECKPOINT_ROOTS", f"{tmp_path}, s3://ml/ckpt")
    with DAG("allowed_roots", schedule=None):
        assert GpuStepOperator(task_id="a", python_callable=work, checkpoint=str(tmp_path / "x")).checkpoint
        assert GpuStepOperator(task_id="b", python_callable=work, checkpoint="s3://ml/ckpt/team").checkpoint
        with pytest.raises(PolicyError, match=r"checkpoint='s3://ml/ckpt-other'"):
            GpuStepOperator(task_id="c", python_callable=work, checkpoint="s3://ml/ckpt-other")


def test_h4_another_user_cannot_redirect_a_tasks_checkpoint_folder(tmp_path, monkeypatch):
    """H4: <root>/<dag> belonged to another local user, who swapped <run> for a link between check and use."""
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o755)
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_CHECKPOINT_ROOTS", str(root))
    labels = {"dag_id": "train", "run_id": "r1", "task_id": "fit", "try_number": "1", "map_index": "-1"}
    folder = location(str(root), labels)
    (root / "train").mkdir()
    os.chown(root / "train", OTHER_USER, OTHER_USER)  # theirs: they may rename or replace anything in it
    backend = BACKENDS["local"].create({}, logging.getLogger("t"))
    request = TaskRequest(
        ResourceSettings(), ImageSettings(), Envelope.run(["true"]), "fail", labels, checkpoint=folder
    )
    with pytest.raises(UnsafePathError, match=f"belongs to uid {OTHER_USER}"):
        backend.run(backend.plan(request, GpuConfig.read()), {})
    assert not Path(folder.path).exists()  # nothing made, nothing run


def test_the_task_folder_is_private_and_its_run_folder_marked(tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_CHECKPOINT_ROOTS", str(tmp_path))
    labels = {"dag_id": "train", "run_id": "r1", "task_id": "fit", "try_number": "1", "map_index": "-1"}
    folder = location(str(tmp_path), labels)
    made = Path(folder.make(labels))
    assert made.stat().st_mode & 0o777 == 0o700 and made.stat().st_uid == os.geteuid()
    assert (made.parent / ".airflow-gpu-provider").is_file()
