from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_gpu_provider.exceptions import InvalidSettingError, UnknownSettingError
from airflow_gpu_provider.settings import (
    AMD,
    NVIDIA,
    Accelerator,
    GpuVendor,
    MigProfile,
    ResourceSettings,
)


def test_defaults_request_nothing():
    settings_ = ResourceSettings()
    assert settings_.gpu_count == 0
    assert not settings_.requests_gpus
    assert settings_.gpu_vendor is NVIDIA
    assert settings_.describe() == "no GPU"


def test_zenml_style_declaration_is_normalised():
    settings_ = ResourceSettings(cpu_count=8, gpu_count=2, memory="16GB", shm_size="2Gi")
    assert (settings_.cpu_count, settings_.gpu_count, settings_.memory, settings_.shm_size) == (
        8.0,
        2,
        16_000_000_000,
        2 * 2**30,
    )
    assert settings_.describe() == "2x nvidia GPU, 8 CPUs, 14.9 GiB memory, 2.0 GiB shm"


@pytest.mark.parametrize(
    ("accelerator", "model", "count"),
    [("A100", "A100", 1), ("A100:2", "A100", 2), ("H100-80GB:8", "H100-80GB", 8), (Accelerator.L4, "L4", 1)],
)
def test_accelerator_sets_model_and_count(accelerator, model, count):
    settings_ = ResourceSettings(accelerator=accelerator)
    assert (settings_.accelerator, settings_.gpu_count) == (model, count)


def test_accelerator_count_agrees_with_gpu_count():
    assert ResourceSettings(accelerator="A100:2", gpu_count=2).gpu_count == 2


def test_accelerator_model_sets_vendor():
    assert ResourceSettings(accelerator="MI300X:4").gpu_vendor is AMD


def test_vendor_names_and_custom_vendor():
    assert ResourceSettings(gpu_vendor="AMD").gpu_vendor is AMD
    habana = GpuVendor("habana", "habana.ai/gaudi", "HABANA_VISIBLE_DEVICES")
    assert ResourceSettings(gpu_count=1, gpu_vendor=habana).gpu_vendor == habana


def test_mig_profile_counts_slices():
    settings_ = ResourceSettings(mig_profile=MigProfile.P1G_10GB)
    assert (settings_.mig_profile, settings_.gpu_count) == ("1g.10gb", 1)
    assert ResourceSettings(mig_profile="3g.40gb", gpu_count=2).gpu_count == 2


def test_gpu_count_all_and_template_strings():
    assert ResourceSettings(gpu_count="all").requests_gpus
    assert ResourceSettings(gpu_count="all").describe() == "all nvidia GPUs"  # not "allx nvidia GPU"
    assert ResourceSettings(gpu_count="3").gpu_count == 3  # a rendered template arrives as text
    assert ResourceSettings(gpu_count=2.0).gpu_count == 2


def test_is_frozen_and_comparable():
    settings_ = ResourceSettings(gpu_count=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings_.gpu_count = 2  # type: ignore[misc]
    assert settings_ == ResourceSettings(gpu_count="1")


def test_with_overrides_validates_again():
    base = ResourceSettings(accelerator="A100:2", memory="8Gi")
    assert base.with_overrides(gpu_count="4").gpu_count == 4
    assert base.with_overrides(accelerator="H100:8").gpu_count == 8
    with pytest.raises(InvalidSettingError, match="memory"):
        base.with_overrides(memory="lots")
    with pytest.raises(UnknownSettingError, match="gpus.*supported: accelerator, cpu_count"):
        base.with_overrides(gpus=2)


@pytest.mark.parametrize(
    ("kwargs", "field", "fragment"),
    [
        ({"gpu_count": -1}, "gpu_count", "must not be negative"),
        ({"gpu_count": 1.5}, "gpu_count", "should be an integer"),
        ({"gpu_count": True}, "gpu_count", "booleans"),
        ({"gpu_count": "two"}, "gpu_count", "should be an integer"),
        ({"memory": "16XB"}, "memory", "unknown unit 'XB'"),
        ({"memory": -5}, "memory", "must not be negative"),
        ({"memory": 0}, "memory", "zero bytes"),
        ({"memory": 1.5}, "memory", "expected int or str"),
        ({"shm_size": "big"}, "shm_size", "not a number"),
        ({"cpu_count": 0}, "cpu_count", "positive"),
        ({"cpu_count": "fast"}, "cpu_count", "not a number"),
        ({"gpu_vendor": "matrox"}, "gpu_vendor", "unknown vendor"),
        ({"gpu_vendor": 3}, "gpu_vendor", "expected a vendor name"),
        ({"accelerator": "A100:x"}, "accelerator", "count 'x'"),
        ({"accelerator": "A100:0"}, "accelerator", "count '0'"),
        ({"accelerator": "A100:2:3"}, "accelerator", "not an accelerator name"),
        ({"accelerator": "A 100"}, "accelerator", "not an accelerator name"),
        ({"accelerator": "A100:3", "gpu_count": 2}, "accelerator", "contradicts gpu_count=2"),
        ({"accelerator": "MI300X", "gpu_vendor": "intel"}, "accelerator", "amd model"),
        ({"mig_profile": "1g.10gb", "gpu_vendor": "amd"}, "mig_profile", "only on NVIDIA"),
        ({"mig_profile": "big"}, "mig_profile", "not a MIG profile"),
        ({"mig_profile": "1g.10gb", "gpu_count": "all"}, "gpu_count", "cannot be combined"),
        # hardening: what str.isdigit() and "$" let through, and values without bounds
        ({"gpu_count": "２"}, "gpu_count", "should be an integer"),
        ({"gpu_count": "٣"}, "gpu_count", "should be an integer"),
        ({"gpu_count": "¹"}, "gpu_count", "should be an integer"),
        ({"gpu_count": 10**30}, "gpu_count", "more than 1024 GPUs"),
        ({"accelerator": "A100:٣"}, "accelerator", "count '٣'"),
        ({"accelerator": "A100:2000"}, "accelerator", "count '2000'"),
        ({"accelerator": "A100\n"}, "accelerator", "not an accelerator name"),
        ({"mig_profile": "1g.10gb\n"}, "mig_profile", "not a MIG profile"),
        ({"mig_profile": "1g.１0gb"}, "mig_profile", "not a MIG profile"),
        ({"cpu_count": 1e-12}, "cpu_count", "out of range"),
        ({"cpu_count": "1e400"}, "cpu_count", "out of range"),
        ({"cpu_count": float("inf")}, "cpu_count", "positive number"),
        ({"cpu_count": float("nan")}, "cpu_count", "positive number"),
        ({"cpu_count": "２"}, "cpu_count", "not a number"),
        ({"memory": 1}, "memory", "out of range"),
        ({"memory": "10Ei"}, "memory", "out of range"),
        ({"memory": "１Gi"}, "memory", "not a number"),
        ({"shm_size": 0}, "shm_size", "None for the default"),
    ],
)
def test_invalid_input_names_field_value_and_accepted_forms(kwargs, field, fragment):
    with pytest.raises(InvalidSettingError) as info:
        ResourceSettings(**kwargs)
    message = str(info.value)
    assert info.value.field == field
    assert f"ResourceSettings: {field}=" in message
    assert fragment in message
    assert "Accepted:" in message


def test_invalid_custom_vendor():
    with pytest.raises(ValueError, match="k8s_resource"):
        GpuVendor("x", "not a resource!", "X")


# --------------------------------------------------------------------------- property-based
suffixes = st.sampled_from(["Mi", "Gi", "M", "G", "MB", "GB", "MiB", "GiB"])
memory_values = st.one_of(  # from Docker's smallest limit (6 MiB) up
    st.integers(min_value=6 * 2**20, max_value=2**45),
    st.builds(lambda n, s: f"{n}{s}", st.integers(min_value=7, max_value=4096), suffixes),
)
accelerators = st.one_of(
    st.none(),
    st.sampled_from([a.value for a in Accelerator if a.value[0] not in "MIT"]),
    st.builds(lambda m, n: f"{m}:{n}", st.sampled_from(["A100", "H100-80GB", "L4", "T4"]), st.integers(1, 16)),
)
valid_kwargs = st.fixed_dictionaries(
    {},
    optional={
        "cpu_count": st.one_of(st.integers(1, 256), st.sampled_from(["500m", "250m", "1.5", "2"])),
        "gpu_count": st.integers(0, 16),
        "memory": memory_values,
        "accelerator": accelerators,
        "shm_size": memory_values,
        "mig_profile": st.one_of(st.none(), st.sampled_from([p.value for p in MigProfile])),
    },
)


@settings(max_examples=1000, deadline=None)
@given(kwargs=valid_kwargs)
def test_any_valid_declaration_builds_a_consistent_object(kwargs):
    accelerator = kwargs.get("accelerator")
    if accelerator and ":" in accelerator and kwargs.get("gpu_count", 0) not in (0, int(accelerator.split(":")[1])):
        with pytest.raises(InvalidSettingError, match="contradicts"):
            ResourceSettings(**kwargs)
        return
    settings_ = ResourceSettings(**kwargs)
    assert isinstance(settings_.gpu_count, int)
    assert settings_.gpu_count >= 0
    if accelerator or settings_.mig_profile:
        assert settings_.gpu_count >= 1
    if settings_.memory is not None:
        assert isinstance(settings_.memory, int)
        assert settings_.memory > 0
    normalised = {f.name: getattr(settings_, f.name) for f in dataclasses.fields(settings_)}
    assert ResourceSettings(**normalised) == settings_  # normalised values are valid input
    assert settings_.with_overrides() == settings_


bad_values = st.one_of(
    st.tuples(st.just("gpu_count"), st.integers(max_value=-1)),
    st.tuples(  # a whole float is a count, a share of one GPU (0 < x < 1, 4 decimals) is valid too (Ray's)
        st.just("gpu_count"),
        st.floats(allow_nan=True).filter(
            lambda x: x != x or not (float(x).is_integer() or (0 < x < 1 and round(x, 4) == x))
        ),
    ),
    st.tuples(st.just("memory"), st.text(min_size=1).filter(lambda t: not t.strip().replace(".", "").isdigit())),
    st.tuples(st.just("cpu_count"), st.integers(max_value=0)),
    st.tuples(
        st.just("gpu_vendor"),
        st.text().filter(lambda t: t.lower() not in ("nvidia", "amd", "intel", "aws-neuron", "google-tpu")),
    ),
    st.tuples(st.just("mig_profile"), st.text().filter(lambda t: "g." not in t)),
)


@settings(max_examples=1000, deadline=None)
@given(bad=bad_values)
def test_any_bad_value_raises_an_error_naming_the_field(bad):
    field, value = bad
    try:
        ResourceSettings(**{field: value})
    except InvalidSettingError as err:
        assert err.field == field
        assert f"{field}=" in str(err)
    else:  # a few generated strings are valid quantities ("1e3", "7Ki"): they must then parse to bytes
        assert field == "memory"
        assert isinstance(ResourceSettings(memory=value).memory, int)
