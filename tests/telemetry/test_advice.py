"""Right-sizing advice, the model of an NVML device name, and the cost of a profile (telemetry/advice.py)."""

from __future__ import annotations

import pytest

from airflow_gpu_provider.telemetry.advice import advice, cost, model_of, parse_prices
from airflow_gpu_provider.telemetry.profile import Profile

GIB = 2**30


def gpu(index: str = "0", *, name: str = "NVIDIA A100-SXM4-80GB", total: float = 80 * GIB, **figures):
    return {"index": index, "uuid": f"GPU-{index}", "name": name, "memory_total": total, **figures}


def profile(*devices, kind: str = "gpu", duration_s: float = 3600.0) -> Profile:
    read = Profile.read({"version": 1, "kind": kind, "duration_s": duration_s, "devices": list(devices)})
    assert read is not None
    return read


@pytest.mark.parametrize(
    ("name", "total", "model"),
    [
        ("NVIDIA A100-SXM4-80GB", 80 * GIB, "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", 80 * GIB, "A100-80GB"),
        ("NVIDIA A100-SXM4-40GB", 40 * GIB, "A100"),
        ("NVIDIA H100 80GB HBM3", 80 * GIB, "H100"),
        ("NVIDIA A10G", 24 * GIB, "A10G"),
        ("NVIDIA A10", 24 * GIB, "A10"),
        ("NVIDIA L4", 24 * GIB, "L4"),
        ("NVIDIA L40S", 48 * GIB, "L40S"),
        ("Tesla T4", 16 * GIB, "T4"),
        ("Tesla V100-SXM2-16GB", 16 * GIB, "V100"),
        ("NVIDIA GeForce RTX 4090", 24 * GIB, None),
    ],
)
def test_model_of_an_nvml_name(name, total, model):
    assert model_of(name, total) == model


def test_a_small_peak_on_a_big_card_names_a_smaller_card_and_a_mig_slice():
    notes = advice(profile(gpu(mean_util=71.0, p95_util=98.0, peak_memory=6.1 * GIB, peak_memory_pct=7.6)))
    assert notes == ["GPU 0: peak 6.1 GiB of 80.0 GiB (8 %): T4 or MIG 1g.10gb would do"]


def test_a_peak_that_needs_more_than_the_small_cards_gets_the_next_one():
    [note] = advice(profile(gpu(mean_util=80.0, p95_util=99.0, peak_memory=30 * GIB, peak_memory_pct=37.5)))
    assert note.endswith("A100 or MIG 3g.40gb would do")  # 30 GiB x 1.2 = 36: a 40 GiB card, a 40 GiB slice


def test_an_unknown_card_is_compared_by_its_own_memory():
    device = gpu(name="NVIDIA GeForce RTX 4090", total=24 * GIB, mean_util=90.0, peak_memory=5 * GIB)
    [note] = advice(profile({**device, "peak_memory_pct": 20.8}))
    assert note.endswith("T4 would do")  # smaller than its 24 GiB; no MIG on it


def test_near_oom_and_idle_and_waiting():
    notes = advice(
        profile(
            gpu("0", mean_util=7.0, p95_util=30.0, peak_memory=78 * GIB, peak_memory_pct=97.5),
            gpu("1", mean_util=25.0, p95_util=60.0, peak_memory=50 * GIB, peak_memory_pct=62.5),
        )
    )
    assert notes == [
        "GPU 0: memory 98 % full (78.0 GiB of 80.0 GiB): close to OOM",
        "GPU 0: mean utilisation 7 %: the GPU was mostly idle (data loading? waiting?)",
        "GPU 1: mean utilisation 25 %: the GPU often waited (input pipeline, small batches?)",
    ]


def test_a_gpu_that_never_ran_a_kernel_means_fewer_would_do():
    notes = advice(
        profile(
            gpu("0", mean_util=88.0, p95_util=99.0, peak_memory=60 * GIB, peak_memory_pct=75.0),
            gpu("1", mean_util=0.0, p95_util=0.0, peak_memory=0.5 * GIB, peak_memory_pct=0.6),
        ),
        gpu_count=2,
    )
    assert notes[-1] == (
        "GPU 1 never ran a kernel: the task used 1 of 2 GPUs (ask for fewer, or spread the work with Accelerate)"
    )


def test_a_well_used_gpu_gets_no_advice():
    assert advice(profile(gpu(mean_util=85.0, p95_util=99.0, peak_memory=60 * GIB, peak_memory_pct=75.0))) == []


def test_a_cpu_profile_gets_cpu_words_and_no_card_advice():
    cpu = {"index": "cpu", "name": "CPU (task process tree, 2 cores)", "memory_total": 24 * GIB}
    notes = advice(profile({**cpu, "mean_util": 4.0, "peak_memory": GIB, "peak_memory_pct": 4.2}, kind="cpu"))
    assert notes == ["mean utilisation 4 %: the CPUs were mostly idle (data loading? waiting?)"]


def test_prices_parse_and_refuse_what_is_not_model_equals_price():
    assert parse_prices("") == {}
    assert parse_prices("A100-80GB=3.04, h100 = 4.1,cpu=0.05") == {"A100-80GB": 3.04, "H100": 4.1, "CPU": 0.05}
    for bad in ("A100", "A100=cheap", "=3", "A100=-1", "A100=inf"):
        with pytest.raises(ValueError, match=r"\[gpu\] prices: .* is not MODEL=PRICE"):
            parse_prices(bad)


def test_cost_by_the_model_nvml_names_for_on_prem_gpus_too():
    two = profile(gpu("0"), gpu("1"), duration_s=1800)
    assert cost(two, {"A100-80GB": 3.0}) == {
        "model": "A100-80GB",
        "price_per_gpu_hour": 3.0,
        "gpu_hours": 1.0,
        "amount": 3.0,
    }


def test_cost_falls_back_to_the_requested_accelerator_and_needs_a_price_for_every_device():
    unknown = profile(gpu(name="NVIDIA Graphics Device"), duration_s=3600)
    assert cost(unknown, {"H100": 4.0}, accelerator="H100")["amount"] == 4.0
    assert cost(unknown, {"H100": 4.0}) is None
    assert cost(profile(gpu()), {}) is None


def test_cost_of_a_cpu_profile_uses_the_cpu_price():
    cpu = profile({"index": "cpu", "name": "CPU"}, kind="cpu", duration_s=7200)
    assert cost(cpu, {"CPU": 0.5}) == {"model": "cpu", "price_per_gpu_hour": 0.5, "gpu_hours": 2.0, "amount": 1.0}
