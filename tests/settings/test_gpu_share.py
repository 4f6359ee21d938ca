"""A share of one GPU, spelled ``gpu_count=0.25`` or ``gpu_share="8GiB"``: checked at parse, one typed value.

Where it runs (local, Docker; Ray's fraction), where it is refused (the rest; a multi-process launch), and how an
out-of-memory failure on a share climbs back to a whole GPU.
"""

from __future__ import annotations

import pytest

from airflow_gpu_provider import AccelerateOperator, GpuStepOperator, OomEscalation, ResourceSettings
from airflow_gpu_provider.escalation.tries import record, rung_for
from airflow_gpu_provider.exceptions import GpuOutOfMemoryError, InvalidSettingError
from airflow_gpu_provider.settings.shares import SHARE_PARTS, GpuShare

GIB = 2**30


def test_a_share_is_a_fraction_or_a_memory_size_of_one_gpu():
    by_memory = ResourceSettings(gpu_share="8GiB")
    assert (by_memory.gpu_count, by_memory.gpu_share) == (1, 8 * GIB)  # one GPU: whole where shares are unknown
    assert by_memory.share == GpuShare(memory=8 * GIB)
    assert by_memory.describe() == "8.0 GiB of 1x nvidia GPU"
    assert ResourceSettings(gpu_share=2**30, gpu_count=1).share == GpuShare(memory=GIB)
    assert ResourceSettings(gpu_count="0.25").share == GpuShare(fraction=0.25)  # a rendered template
    assert ResourceSettings(gpu_count=1).share is None and "gpu_share" not in ResourceSettings().to_dict()
    assert ResourceSettings(gpu_share="8GiB").without_gpus().requests_gpus is False
    assert ResourceSettings(gpu_share="8GiB").with_overrides(gpu_share=None).share is None  # the whole GPU


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ({"gpu_share": "lots"}, "not a number"),
        ({"gpu_share": "1Mi"}, "out of range"),
        ({"gpu_share": True}, "expected int or str"),
        ({"gpu_share": "8GiB", "gpu_count": 2}, "a share is of one GPU"),
        ({"gpu_share": "8GiB", "gpu_count": 0.5}, "a share already"),
        ({"gpu_share": "8GiB", "mig_profile": "1g.10gb"}, "MIG slice"),
    ],
)
def test_a_bad_share_names_the_field_the_value_and_what_is_accepted(given, reason):
    with pytest.raises(InvalidSettingError, match=reason) as caught:
        ResourceSettings(**given)
    assert caught.value.field == "gpu_share" and caught.value.value == given["gpu_share"]
    assert caught.value.accepted  # what would do instead


def test_parts_of_a_gpu_round_up_and_a_fraction_is_exact():
    assert GpuShare(fraction=0.3333).parts_on(None) == 3333  # three of them fit
    assert GpuShare(memory=8 * GIB).parts_on(24 * GIB) == 3334  # rounded up: never promised less than asked
    assert GpuShare(memory=8 * GIB).parts_on(None) is None  # unknown memory: cannot be placed by memory
    assert GpuShare(memory=32 * GIB).parts_on(24 * GIB) is None  # larger than the GPU
    assert GpuShare(fraction=0.25).memory_on(24 * GIB) == 6 * GIB and SHARE_PARTS == 10_000


def test_the_local_and_docker_backends_take_shares_and_the_others_say_where_they_run():
    for backend in ("local", "docker"):
        assert GpuStepOperator(task_id="t", command=["true"], backend=backend, gpu_share="8GiB").task_spec
    with pytest.raises(InvalidSettingError, match="gives a task whole GPUs; a share of one works on the local, docker"):
        GpuStepOperator(task_id="t", command=["true"], backend="kubernetes", gpu_count=0.5)
    with pytest.raises(InvalidSettingError, match="gpu_share=.*Ray schedules fractions"):
        GpuStepOperator(task_id="t", command=["true"], backend="ray", gpu_share="8GiB")
    with pytest.raises(InvalidSettingError, match="gpu_vendor='amd'.*NVIDIA GPUs only"):
        GpuStepOperator(task_id="t", command=["true"], backend="local", gpu_count=0.5, gpu_vendor="amd")


def test_a_multi_process_launch_takes_whole_gpus():
    with pytest.raises(InvalidSettingError, match=r"gpu_share=.*accelerate launch\) takes whole GPUs"):
        AccelerateOperator(task_id="t", script="train.py", backend="local", gpu_share="8GiB", num_processes=2)


def test_a_share_joins_no_gpu_pool(monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU__POOL", "gpu")
    shared = GpuStepOperator(task_id="s", command=["true"], backend="local", gpu_share="8GiB")
    whole = GpuStepOperator(task_id="w", command=["true"], backend="local", gpu_count=1)
    assert (whole.pool, whole.pool_slots) == ("gpu", 1)
    assert shared.pool != "gpu"  # the pool counts whole GPUs; the host allocator places shares by memory


def test_an_oom_on_a_share_climbs_back_to_the_whole_gpu_then_the_ladder():
    share = ResourceSettings(gpu_share="8GiB")
    error = GpuOutOfMemoryError("CUDA out of memory", gpus=[{"index": "0", "memory_total": 24 * GIB}])
    history = [record(1, share, error)]
    assert history[0]["gpu_memory"] == 8 * GIB  # what ran out is the share, not the card
    rung = rung_for(OomEscalation(), share, history, 2)
    assert rung.resources.share is None and rung.resources.gpu_count == 1
    assert rung.min_gpu_memory == 8 * GIB and "GPU step 1/1" in rung.line
    ladder = OomEscalation(accelerators=["L4", "A100-80GB"])
    fraction = ResourceSettings(gpu_count=0.25, accelerator="L4")
    climbed = rung_for(ladder, fraction, [{"try": 1, "kind": "gpu_oom"}] * 2, 3).resources
    assert (climbed.gpu_count, climbed.accelerator, climbed.share) == (1, "A100-80GB", None)
