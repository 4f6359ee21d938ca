"""OOM escalation on Kubernetes at the rendered level: the pod of the try after an OOM asks for the next step.

No cluster exists here, so the try after an OOM is rendered (``render_manifests(after=[...])``), with the real
provider code, and validated strictly; tests/operators/test_oom_escalation.py runs the same decision for real.
"""

from __future__ import annotations

import datetime

import pytest
from airflow.sdk import DAG
from k8s_manifests import envelope_of, main_container, validate, with_secret

from airflow_gpu_provider import GpuStepOperator, OomEscalation
from airflow_gpu_provider.exceptions import InvalidSettingError

pytestmark = pytest.mark.usefixtures("airflow_home")
LADDER = OomEscalation(mig_profiles=["3g.40gb"], accelerators=["A100-80GB", "H100"], memory=["32Gi", "64Gi"])


def train():
    return 1


def _task(**resources) -> GpuStepOperator:
    with DAG("k8s_oom", schedule=None, start_date=datetime.datetime(2024, 1, 1)):
        return GpuStepOperator(
            task_id="train", python_callable=train, backend="kubernetes", on_oom=LADDER, memory="16Gi", **resources
        )


def _pod(task: GpuStepOperator, after: list[str]) -> tuple[dict, dict]:
    secret, [pod] = with_secret([validate(obj) for obj in task.render_manifests(after=after)])
    pod["envelope"] = envelope_of(secret)
    return pod, main_container(pod)


def test_each_gpu_oom_renders_the_next_mig_slice_then_the_next_card():
    task = _task(accelerator="A100-80GB", mig_profile="1g.10gb")
    _, first = _pod(task, [])
    assert first["resources"]["limits"]["nvidia.com/mig-1g.10gb"] == "1"
    _, second = _pod(task, ["gpu_oom"])
    assert second["resources"]["limits"]["nvidia.com/mig-3g.40gb"] == "1"
    pod, third = _pod(task, ["gpu_oom", "error", "gpu_oom"])  # other failures do not climb
    assert third["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert not any(name.startswith("nvidia.com/mig") for name in third["resources"]["limits"])
    [term] = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    [products] = term["matchExpressions"]
    assert products["key"] == "nvidia.com/gpu.product"
    assert "NVIDIA-H100-80GB-HBM3" in products["values"]
    assert not any("A100" in value for value in products["values"])
    envelope = pod["envelope"]
    assert envelope["summary"]["effective"]["accelerator"] == "H100"  # the pod's AIRFLOW_GPU_RESOURCES


def test_a_host_oom_renders_the_next_memory_limit_and_keeps_the_gpu():
    task = _task(accelerator="A100-80GB")
    _, first = _pod(task, [])
    _, second = _pod(task, ["host_oom"])
    assert first["resources"]["limits"]["memory"] == "16Gi"
    assert second["resources"]["limits"]["memory"] == "32Gi"
    assert second["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_render_after_needs_a_ladder():
    with DAG("k8s_no_ladder", schedule=None, start_date=datetime.datetime(2024, 1, 1)):
        task = GpuStepOperator(task_id="t", python_callable=train, backend="kubernetes", gpu_count=1)
    with pytest.raises(InvalidSettingError, match="after"):
        task.render_manifests(after=["gpu_oom"])
    with pytest.raises(
        InvalidSettingError, match=r"after=\['oom'\].*unknown \['oom'\].*'gpu_oom', 'host_oom' or 'error'"
    ):
        _task(accelerator="L4").render_manifests(after=["oom"])
