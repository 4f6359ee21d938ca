"""The checkpoint folder, decided once (task/checkpoint.py): its place, path-safe names, and bad input at parse."""

from __future__ import annotations

import pytest
from airflow.sdk import DAG
from fsspec.registry import known_implementations

from airflow_gpu_provider import AccelerateOperator, GpuStepOperator, gpu_task
from airflow_gpu_provider.checkpoint.location import (
    URI_SCHEMES,
    CheckpointLocation,
    check_root,
    location,
    path_segment,
    run_folder,
    task_location,
)
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.policy import PolicyError

LABELS = {"dag_id": "train", "run_id": "manual__2024-01-01T00:00:00+00:00", "task_id": "fit", "map_index": "-1"}


def work() -> None:
    return None


def test_the_folder_is_per_task_and_run_and_the_same_for_every_try():
    folder = location("/ckpt", {**LABELS, "try_number": "1"})
    assert folder == location("/ckpt", {**LABELS, "try_number": "2"})
    assert folder.path == "/ckpt/train/manual__2024-01-01T00~3A00~3A00~2B00~3A00/fit"
    assert folder.path.startswith("/ckpt/" + run_folder(LABELS["dag_id"], LABELS["run_id"]) + "/")
    others = [
        location("/ckpt", {**LABELS, "run_id": "manual__2024-01-02T00:00:00+00:00"}),
        location("/ckpt", {**LABELS, "task_id": "fit2"}),
        location("/ckpt", {**LABELS, "dag_id": "train2"}),
        location("/ckpt", {**LABELS, "map_index": "0"}),
        location("/ckpt", {**LABELS, "map_index": "1"}),
    ]
    assert len({folder.path, *(other.path for other in others)}) == 6
    assert others[3].path.endswith("/fit~map0")
    uri = location("s3://bucket/ckpt/", LABELS)
    assert uri.is_uri and uri.path == "s3://bucket/ckpt/train/manual__2024-01-01T00~3A00~3A00~2B00~3A00/fit"


@pytest.mark.parametrize(
    "names",
    [
        ["a/b", "a~2Fb", "a_2Fb", "a%2Fb"],
        [".", "..", "~2E", "~2E~2E", "_."],
        ["run", "run~", "run~7E", "ru~6E"],
        ["é", "~C3~A9", "e"],
        ["x" * 250, "x" * 249 + "y", "x" * 249 + "/"],
    ],
)
def test_path_segments_never_collide_and_stay_one_safe_folder_name(names):
    segments = [path_segment(name) for name in names]
    assert len(set(segments)) == len(names), segments
    for segment in segments:
        assert "/" not in segment and segment not in ("", ".", "..") and not segment.startswith(".")
        assert len(segment.encode()) <= 255


def test_map_index_suffix_never_matches_an_escaped_task_id():
    mapped = location("/c", {**LABELS, "task_id": "fit", "map_index": "3"}).path
    assert all(location("/c", {**LABELS, "task_id": tid}).path != mapped for tid in ("fit~map3", "fit.map3", "fit~m3"))


def test_every_scheme_is_one_fsspec_knows():
    assert set(URI_SCHEMES) <= set(known_implementations)


def test_default_root_is_the_state_dir_then_the_config(state_dir, monkeypatch):
    assert task_location("t", None, LABELS, GpuConfig.read()) == location(f"{state_dir}/checkpoints", LABELS)
    monkeypatch.setenv("AIRFLOW__GPU__CHECKPOINT_ROOT", "gs://models/ckpt")
    assert task_location("t", None, LABELS, GpuConfig.read()) == CheckpointLocation(
        "gs://models/ckpt", location("/", LABELS).relative
    )
    with pytest.raises(PolicyError, match=r"checkpoint='/data/ckpt' is invalid: a checkpoint root the deployment"):
        task_location("t", "/data/ckpt", LABELS, GpuConfig.read())  # rule: never a folder of the DAG author's own
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_CHECKPOINT_ROOTS", "/data")
    assert task_location("t", "/data/ckpt", LABELS, GpuConfig.read()).root == "/data/ckpt"  # the task's own wins
    assert task_location("t", False, LABELS, GpuConfig.read()) is None
    monkeypatch.setenv("AIRFLOW__GPU__CHECKPOINT_ROOT", "relative/ckpt")
    with pytest.raises(InvalidSettingError, match=r"\[gpu\]: checkpoint_root='relative/ckpt' is invalid: a relative"):
        task_location("t", None, LABELS, GpuConfig.read())


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("ftps2://bucket/x", "unknown storage scheme 'ftps2'.*Accepted: s3://"),
        ("memory://x", "unknown storage scheme 'memory'"),
        ("s3://", "the URI names no bucket or folder"),
        ("ckpt", "a relative path means another folder on every worker"),
        ("", "expected a path or URI"),
        (3, "expected a path or URI"),
        (True, "expected a path or URI"),
    ],
)
def test_bad_roots_fail_at_parse_naming_the_field(value, reason):
    with DAG("checkpoint_bad", schedule=None):
        with pytest.raises(InvalidSettingError, match=rf"GpuStepOperator\('t'\): checkpoint=.* is invalid: {reason}"):
            GpuStepOperator(task_id="t", python_callable=work, checkpoint=value)
        with pytest.raises(InvalidSettingError, match=rf"checkpoint=.* is invalid: {reason}"):
            gpu_task(checkpoint=value)(work)()


def test_good_roots_and_templates_are_kept(monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_CHECKPOINT_ROOTS", "s3://b")
    assert check_root("o", "checkpoint", "/data//ckpt/") == "/data/ckpt"
    assert check_root("o", "checkpoint", "S3://Bucket/ckpt") == "S3://Bucket/ckpt"
    assert check_root("o", "checkpoint", "file:///data/ckpt") == "file:///data/ckpt"
    assert check_root("o", "checkpoint", "{{ params.root }}") == "{{ params.root }}"
    with DAG("checkpoint_good", schedule=None):
        assert GpuStepOperator(task_id="t", python_callable=work, checkpoint="s3://b/c").checkpoint == "s3://b/c"


def test_resume_is_checked_at_parse():
    with DAG("checkpoint_resume_bad", schedule=None):
        with pytest.raises(InvalidSettingError, match="resume='yes' is invalid: expected a boolean"):
            AccelerateOperator(task_id="a", python_callable=work, resume="yes")
        with pytest.raises(InvalidSettingError, match="resume=True is invalid: a task without a checkpoint folder"):
            AccelerateOperator(task_id="b", python_callable=work, resume=True, checkpoint=False)
        with pytest.raises(InvalidSettingError, match="resume=True is invalid"):
            gpu_task(accelerate={"resume": True}, checkpoint=False)(work)()
