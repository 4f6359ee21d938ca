"""Checkpoints on Kubernetes, at the rendered-pod level: the claim's subPath or the URI, resume, the grace period."""

from __future__ import annotations

import pytest
from airflow.sdk import DAG
from k8s_manifests import env, envelope_of, main_container, validate, with_secret

from airflow_gpu_provider import AccelerateOperator, GpuStepOperator
from airflow_gpu_provider.checkpoint.location import CHECKPOINT_MOUNT
from airflow_gpu_provider.exceptions import GpuTaskError, InvalidSettingError

pytestmark = pytest.mark.usefixtures("airflow_home")


@pytest.fixture(autouse=True)
def allowed_roots(monkeypatch):
    """The deployment allows these checkpoint roots (rule F3, policy/checkpoints.py)."""
    monkeypatch.setenv("AIRFLOW__GPU_POLICY__ALLOWED_CHECKPOINT_ROOTS", "/checkpoints, s3://models/ckpt")


def work() -> None:
    return None


def _pod(task) -> dict:
    secret, [pod] = with_secret([validate(obj) for obj in task.render_manifests()])
    pod["envelope"] = envelope_of(secret)  # the task's Secret holds it
    return pod


def test_a_path_root_is_the_claims_subpath_per_task_and_run():
    with DAG("ckpt_k8s", schedule=None):
        task = AccelerateOperator(
            task_id="fit",
            python_callable=work,
            backend="kubernetes",
            checkpoint="/checkpoints",
            resume=True,
            backend_options={"checkpoint_claim": "training-checkpoints", "termination_grace_period": 120},
        )
    pod = _pod(task)
    base = main_container(pod)
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "checkpoint")
    assert volume == {"name": "checkpoint", "persistentVolumeClaim": {"claimName": "training-checkpoints"}}
    mount = next(m for m in base["volumeMounts"] if m["name"] == "checkpoint")
    assert mount == {"name": "checkpoint", "mountPath": CHECKPOINT_MOUNT, "subPath": "ckpt_k8s/render/fit"}
    assert env(base)["AIRFLOW_GPU_CHECKPOINT_DIR"] == CHECKPOINT_MOUNT
    assert pod["spec"]["terminationGracePeriodSeconds"] == 120
    assert pod["envelope"]["resume"] is True


def test_a_uri_root_reaches_the_pod_as_the_uri_and_the_grace_defaults_to_the_config(monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU__KILL_GRACE", "45")
    with DAG("ckpt_k8s_uri", schedule=None):
        task = GpuStepOperator(task_id="fit", python_callable=work, backend="kubernetes", checkpoint="s3://models/ckpt")
    pod = _pod(task)
    assert env(main_container(pod))["AIRFLOW_GPU_CHECKPOINT_DIR"] == "s3://models/ckpt/ckpt_k8s_uri/render/fit"
    assert not any(v["name"] == "checkpoint" for v in pod["spec"]["volumes"])
    assert pod["spec"]["terminationGracePeriodSeconds"] == 45


def test_a_path_root_without_a_claim_gives_the_pod_no_folder_and_cannot_resume():
    with DAG("ckpt_k8s_none", schedule=None):
        plain = GpuStepOperator(task_id="plain", python_callable=work, backend="kubernetes")
        resuming = AccelerateOperator(task_id="resuming", python_callable=work, backend="kubernetes", resume=True)
    assert "AIRFLOW_GPU_CHECKPOINT_DIR" not in env(main_container(_pod(plain)))
    with pytest.raises(GpuTaskError, match=r"resume=True.*Set backend_options\['checkpoint_claim'\]"):
        resuming.render_manifests()


def test_a_bad_claim_name_fails_at_parse():
    bad = r"backend_options\['checkpoint_claim'\]='Bad_Claim' is invalid"
    with DAG("ckpt_k8s_bad", schedule=None), pytest.raises(InvalidSettingError, match=bad):
        GpuStepOperator(
            task_id="t", python_callable=work, backend="kubernetes", backend_options={"checkpoint_claim": "Bad_Claim"}
        )
