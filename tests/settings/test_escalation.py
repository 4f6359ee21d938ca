"""``OomEscalation``: ladders checked at DAG parse, naming the field; the steps a task climbs."""

from __future__ import annotations

import pytest

from airflow_gpu_provider import Accelerator, GpuStepOperator, MigProfile, OomEscalation, ResourceSettings
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.host.inventory import parse_devices

GIB = 2**30


@pytest.mark.parametrize(
    ("ladder", "field", "why"),
    [
        ({"accelerators": ["L4", "A100-80GB", "WARP9"]}, "accelerators='WARP9'", "unknown accelerator"),
        ({"accelerators": ["H100", "L4"]}, "accelerators=['H100', 'L4']", "does not go up: L4 (24 GiB) after H100"),
        ({"accelerators": ["L4", "l4"]}, "accelerators=['L4', 'l4']", "does not go up"),
        ({"accelerators": "L4"}, "accelerators='L4'", "expected a list"),
        ({"accelerators": ["A100:2"]}, "accelerators='A100:2'", "not an accelerator name"),
        ({"mig_profiles": ["3g.40gb", "1g.10gb"]}, "mig_profiles=", "does not go up"),
        ({"mig_profiles": ["big"]}, "mig_profiles='big'", "not a MIG profile"),
        ({"memory": ["32Gi", "16Gi"]}, "memory=['32.0 GiB', '16.0 GiB']", "does not go up"),
        ({"memory": ["lots"]}, "memory='lots'", "Accepted: integer bytes"),
    ],
)
def test_bad_ladders_are_refused_naming_the_field(ladder, field, why):
    with pytest.raises(InvalidSettingError, match=r"test_escalation\.py:\d+: OomEscalation: ") as raised:
        OomEscalation(**ladder)
    assert field in str(raised.value) and why in str(raised.value)


def test_a_model_of_as_much_memory_may_follow_and_enums_are_taken():
    ladder = OomEscalation(accelerators=[Accelerator.L4, "A100-80GB", "H100"], mig_profiles=[MigProfile.P3G_40GB])
    assert ladder.accelerators == ("L4", "A100-80GB", "H100") and ladder.mig_profiles == ("3g.40gb",)


def test_the_steps_start_above_the_tasks_own_resources():
    ladder = OomEscalation(accelerators=["L4", "A100-40GB", "A100-80GB", "H100"], memory=["16Gi", "32Gi"])
    own = ResourceSettings(accelerator="L4:2", memory="16Gi")
    assert [s["accelerator"] for s in ladder.gpu_steps(own)] == ["A100-40GB", "A100-80GB", "H100"]
    assert ladder.memory_steps(own) == [{"memory": 32 * GIB}]
    climbed, exhausted = ladder.climb(own, gpu_ooms=2, host_ooms=1)
    assert (climbed.accelerator, climbed.gpu_count, climbed.memory, exhausted) == ("A100-80GB", 2, 32 * GIB, None)
    top, exhausted = ladder.climb(own, gpu_ooms=4, host_ooms=0)
    assert top.accelerator == "H100" and exhausted == "GPU"
    # a task without a model climbs the whole ladder; one not in it, the steps with more memory
    assert len(ladder.gpu_steps(ResourceSettings(gpu_count=1))) == 4
    assert ladder.gpu_steps(ResourceSettings(accelerator="A10"))[0]["accelerator"] == "A100-40GB"


@pytest.mark.usefixtures("airflow_home")
def test_the_operator_refuses_a_ladder_that_leads_nowhere_from_its_resources():
    with pytest.raises(InvalidSettingError, match=r"on_oom\.accelerators=\['L4'\].*no step has more memory"):
        GpuStepOperator(task_id="t", command=["true"], accelerator="H100", on_oom=OomEscalation(accelerators=["L4"]))
    with pytest.raises(InvalidSettingError, match=r"on_oom\.memory=.*no step is above the task's own memory"):
        GpuStepOperator(task_id="t", command=["true"], memory="64Gi", on_oom=OomEscalation(memory=["32Gi"]))
    with pytest.raises(InvalidSettingError, match=r"on_oom=\['L4'\].*expected an OomEscalation"):
        GpuStepOperator(task_id="t", command=["true"], on_oom=["L4"])


def test_configured_devices_may_name_their_model():
    devices = parse_devices("0=L4, 1=A100-80GB,GPU-abc")
    assert [(d.id, d.name, d.memory_total) for d in devices] == [
        ("0", "L4", 24 * GIB),
        ("1", "A100-80GB", 80 * GIB),
        ("GPU-abc", None, None),
    ]
    with pytest.raises(InvalidSettingError, match="devices="):
        parse_devices("0=A100:2")


@pytest.mark.usefixtures("airflow_home")
def test_the_decorator_and_accelerate_take_a_ladder():
    import datetime

    from airflow.sdk import DAG

    from airflow_gpu_provider import AccelerateOperator, gpu_task

    ladder = OomEscalation(accelerators=["A100-80GB"])
    with DAG("ladders", schedule=None, start_date=datetime.datetime(2024, 1, 1)) as dag:

        @gpu_task(accelerator="L4", on_oom=ladder)
        def train() -> None:
            pass

        train()
        AccelerateOperator(task_id="fit", script="train.py", accelerator="L4", on_oom=ladder)
    assert dag.get_task("train").on_oom is ladder and dag.get_task("fit").on_oom is ladder
