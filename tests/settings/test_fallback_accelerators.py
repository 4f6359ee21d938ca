"""Accelerator fallback lists: ``accelerator=["H100", "A100-80GB"]``, ordered, each model checked at parse."""

from __future__ import annotations

import pytest

from airflow_gpu_provider import GpuStepOperator, OomEscalation, ResourceSettings
from airflow_gpu_provider.exceptions import InvalidSettingError


def test_a_list_keeps_its_order_and_a_single_model_stays_as_today() -> None:
    listed = ResourceSettings(accelerator=["H100", "A100-80GB"])
    assert (listed.accelerator, listed.fallback_accelerators, listed.gpu_count) == ("H100", ("A100-80GB",), 1)
    assert listed.accelerators == ("H100", "A100-80GB")
    assert listed.describe() == "1x nvidia H100 or A100-80GB"
    single = ResourceSettings(accelerator="H100")
    assert (single.accelerator, single.fallback_accelerators, single.accelerators) == ("H100", (), ("H100",))
    assert ResourceSettings(accelerator=("L4",)) == ResourceSettings(accelerator="L4")
    assert ResourceSettings().accelerators == ()


def test_a_count_in_the_list_applies_to_every_model_and_copies_keep_the_list() -> None:
    listed = ResourceSettings(accelerator=["H100:2", "A100-80GB"], cpu_count=4)
    assert listed.gpu_count == 2 and listed.accelerators == ("H100", "A100-80GB")
    assert listed.with_overrides(memory="8Gi").accelerators == ("H100", "A100-80GB")
    assert listed.to_dict()["fallback_accelerators"] == ["A100-80GB"]
    replaced = listed.with_overrides(accelerator="H200")  # a new accelerator replaces the whole list
    assert (replaced.accelerators, replaced.gpu_count) == (("H200",), 1)
    assert listed.without_gpus().accelerators == ()


def test_amd_models_in_a_list_take_their_vendor() -> None:
    assert ResourceSettings(accelerator=["MI300X", "MI250X"]).gpu_vendor.name == "amd"


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ([], "non-empty list"),
        (["H100", "h100"], "listed twice"),
        (["H100:2", "A100:1"], "different counts"),
        (["H100", "MI300X"], "mixes vendors"),
        (["H100", 7], "not an accelerator name"),
    ],
)
def test_bad_lists_are_refused_naming_the_field(value, why) -> None:
    with pytest.raises(InvalidSettingError) as raised:
        ResourceSettings(accelerator=value)
    assert "accelerator=" in str(raised.value) and why in str(raised.value) and "Accepted:" in str(raised.value)


def test_fallbacks_without_a_first_model_are_refused() -> None:
    with pytest.raises(InvalidSettingError, match="fallback_accelerators=.*expected the models after accelerator"):
        ResourceSettings(fallback_accelerators=("A100",))
    with pytest.raises(InvalidSettingError, match="accelerator is already a list"):
        ResourceSettings(accelerator=["H100"], fallback_accelerators=("A100",))


def test_an_unknown_model_in_a_list_is_refused_at_parse() -> None:
    with pytest.raises(InvalidSettingError) as raised:
        GpuStepOperator(task_id="train", command=["true"], backend="kubernetes", accelerator=["H100", "A1000"])
    message = str(raised.value)
    assert "GpuStepOperator('train'): accelerator='A1000' is invalid: not a known accelerator model" in message
    assert "did you mean 'A100'" in message and "[gpu] extra_accelerators" in message


def test_a_deployment_model_may_be_in_a_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__GPU__EXTRA_ACCELERATORS", "RTX-5090")
    operator = GpuStepOperator(task_id="t", command=["true"], accelerator=["RTX-5090", "L40S"])
    assert operator.task_spec.resources.accelerators == ("RTX-5090", "L40S")


def test_a_list_has_no_one_queue_or_pool_per_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__GPU__POOL", "gpu-{accelerator}")
    with pytest.raises(InvalidSettingError, match="a list of models has no one worker class"):
        GpuStepOperator(task_id="t", command=["true"], backend="local", accelerator=["H100", "A100-80GB"])
    monkeypatch.setenv("AIRFLOW__GPU__POOL", "gpu")
    GpuStepOperator(task_id="t", command=["true"], backend="local", accelerator=["H100", "A100-80GB"])


def test_the_oom_ladder_climbs_from_the_largest_card_of_the_list_and_a_rung_replaces_the_list() -> None:
    listed = ResourceSettings(accelerator=["L4", "A100-80GB"])
    ladder = OomEscalation(accelerators=["A100-80GB", "H100", "H200"])
    assert ladder.gpu_steps(listed) == [
        {"accelerator": "H100", "mig_profile": None},
        {"accelerator": "H200", "mig_profile": None},
    ]
    climbed, exhausted = ladder.climb(listed, gpu_ooms=1, host_ooms=0)
    assert (climbed.accelerators, exhausted) == (("H100",), None)
    unnamed = OomEscalation(accelerators=["A10", "A100-80GB", "H200"])  # the list's cards by memory: above 80 GiB
    assert [s["accelerator"] for s in unnamed.gpu_steps(ResourceSettings(accelerator=["L4", "A100-80GB"]))] == ["H200"]
    with pytest.raises(InvalidSettingError, match="no step has more memory"):
        GpuStepOperator(
            task_id="t", command=["true"], accelerator=["H200", "L4"], on_oom=OomEscalation(accelerators=["H100"])
        )
