"""Accelerator models: a typo is refused when the DAG is parsed, on every backend; a deployment can add models."""

from __future__ import annotations

import pytest

from airflow_gpu_provider import GpuStepOperator
from airflow_gpu_provider.backends import BACKENDS
from airflow_gpu_provider.backends.pods.node_labels import LABEL_SCHEMES
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.settings.accelerators import KNOWN_MODELS, check_model


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("model", ["A1000", "banana", "h1OO"])
@pytest.mark.parametrize("policy", ["fail", "cpu"])
def test_an_unknown_model_is_refused_at_parse_on_every_backend(backend: str, model: str, policy: str) -> None:
    """With ``on_missing_gpu="cpu"`` too: a typo must not quietly run on the CPU."""
    with pytest.raises(InvalidSettingError) as raised:
        GpuStepOperator(task_id="train", command=["true"], backend=backend, accelerator=model, on_missing_gpu=policy)
    message = str(raised.value)
    assert f"GpuStepOperator('train'): accelerator={model!r} is invalid: not a known accelerator model" in message
    assert "Accepted: A10, A100, A100-40GB, A100-80GB" in message and "[gpu] extra_accelerators" in message


def test_the_closest_known_models_are_suggested() -> None:
    with pytest.raises(InvalidSettingError, match="did you mean 'A100'"):
        check_model("t", "A1000")
    with pytest.raises(InvalidSettingError) as raised:
        check_model("t", "banana")
    assert "did you mean" not in str(raised.value)


@pytest.mark.parametrize("model", ["A100", "a100", "H100-80GB", "A100:2", "L4", "MI300X", "TPU-V5E:4", "RTX-4090"])
def test_known_models_pass_in_any_case_and_with_a_count(model: str) -> None:
    operator = GpuStepOperator(task_id="train", command=["true"], accelerator=model)
    assert operator.task_spec.resources.accelerator.upper() in KNOWN_MODELS


def test_a_deployment_adds_models_with_extra_accelerators(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InvalidSettingError, match="'RTX-5090'"):
        GpuStepOperator(task_id="t", command=["true"], accelerator="RTX-5090")
    monkeypatch.setenv("AIRFLOW__GPU__EXTRA_ACCELERATORS", "L20, rtx-5090")
    operator = GpuStepOperator(task_id="t", command=["true"], accelerator="RTX-5090:2")
    assert (operator.task_spec.resources.accelerator, operator.task_spec.resources.gpu_count) == ("RTX-5090", 2)
    with pytest.raises(InvalidSettingError, match="this deployment's L20, rtx-5090"):
        GpuStepOperator(task_id="t", command=["true"], accelerator="RTX-5080")


def test_the_models_of_gpu_devices_are_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", "0=QUADRO-X,1=L4")
    operator = GpuStepOperator(task_id="t", command=["true"], accelerator="QUADRO-X")
    assert operator.task_spec.resources.accelerator == "QUADRO-X"


def test_a_templated_model_is_checked_when_rendered() -> None:
    operator = GpuStepOperator(task_id="t", command=["true"], accelerator="{{ params.model }}")
    operator.resource_overrides = {"accelerator": "A1000"}  # as the template renders it when the task starts
    with pytest.raises(InvalidSettingError, match="accelerator='A1000' is invalid: not a known accelerator model"):
        operator.rendered_spec()
    operator.resource_overrides = {"accelerator": "H100"}
    assert operator.rendered_spec().resources.accelerator == "H100"


@pytest.mark.parametrize("scheme", sorted(LABEL_SCHEMES))
def test_every_model_a_kubernetes_label_scheme_knows_is_a_known_model(scheme: str) -> None:
    assert set(LABEL_SCHEMES[scheme].models) <= KNOWN_MODELS
