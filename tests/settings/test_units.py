from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.utils import parse_quantity as k8s_parse_quantity

from airflow_gpu_provider.settings.units import (
    Unit,
    format_bytes,
    format_k8s_bytes,
    format_k8s_cpu,
    parse_bytes,
    parse_cpu,
    parse_quantity,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16Gi", 16 * 2**30),
        ("16GiB", 16 * 2**30),
        ("16gib", 16 * 2**30),
        ("16G", 16 * 10**9),
        ("16GB", 16 * 10**9),
        ("16gb", 16 * 10**9),
        ("512Mi", 512 * 2**20),
        ("512MB", 512 * 10**6),
        ("1.5Gi", 1610612736),
        ("100", 100),
        ("100B", 100),
        ("1k", 1000),
        ("1K", 1000),
        ("1KiB", 1024),
        (" 2Ti ", 2 * 2**40),
        (4096, 4096),
        (0, 0),
    ],
)
def test_parse_bytes_accepts_kubernetes_and_byte_spellings(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["16XB", "GB", "", "-1Gi", "1.2.3G", "16 G B", "1m", "abc", "0x10"])
def test_parse_bytes_rejects_garbage(text):
    with pytest.raises(ValueError):
        parse_bytes(text)


@pytest.mark.parametrize("value", [1.5, None, [], True])
def test_parse_bytes_rejects_other_types(value):
    with pytest.raises(TypeError):
        parse_bytes(value)


def test_fractional_bytes_round_up_like_kubernetes():
    assert parse_bytes("0.5Ki") == 512
    assert parse_bytes("1.0000001k") == 1001


@pytest.mark.parametrize(("value", "cores"), [(4, 4.0), (0.5, 0.5), ("500m", 0.5), ("2", 2.0), ("1.5", 1.5)])
def test_parse_cpu(value, cores):
    assert parse_cpu(value) == cores


@pytest.mark.parametrize("value", [0, -1, "0m", "-2", "x", float("nan"), float("inf")])
def test_parse_cpu_rejects(value):
    with pytest.raises(ValueError):
        parse_cpu(value)


k8s_suffixes = st.sampled_from([u.suffix for u in Unit if u is not Unit.MILLI] + [""])
numbers = st.one_of(
    st.integers(min_value=0, max_value=10**6).map(str),
    st.decimals(min_value=0, max_value=10**4, places=3, allow_nan=False, allow_infinity=False).map(str),
)


@settings(max_examples=500, deadline=None)
@given(number=numbers, suffix=k8s_suffixes)
def test_every_kubernetes_quantity_parses_like_the_kubernetes_client(number, suffix):
    text = f"{number}{suffix}"
    assert parse_quantity(text) == Decimal(k8s_parse_quantity(text))


@settings(max_examples=300, deadline=None)
@given(amount=st.integers(min_value=0, max_value=2**70))
def test_format_k8s_bytes_round_trips_through_the_kubernetes_client(amount):
    assert int(k8s_parse_quantity(format_k8s_bytes(amount))) == amount


@settings(max_examples=300, deadline=None)
@given(millis=st.integers(min_value=1, max_value=10**7))
def test_format_k8s_cpu_round_trips(millis):
    cores = millis / 1000
    assert Decimal(k8s_parse_quantity(format_k8s_cpu(cores))) == Decimal(millis) / 1000


def test_format_bytes_for_logs():
    assert format_bytes(17179869184) == "16.0 GiB"
    assert format_bytes(512) == "512 B"
