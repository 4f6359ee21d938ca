from __future__ import annotations

import pytest

from airflow_gpu_provider.backends.docker.images.catalogue import CATALOGUE, cpu_only_reason, pytorch_image
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.settings.image import DEFAULT_PARENT_IMAGE


def test_pytorch_image_by_torch_and_cuda():
    assert pytorch_image("2.5.1", cuda="12.4") == "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
    assert pytorch_image("2.3.1", cuda="12.1", flavor="devel") == "pytorch/pytorch:2.3.1-cuda12.1-cudnn8-devel"


def test_newest_cuda_is_the_default():
    assert pytorch_image("2.7.1") == "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime"


def test_unknown_combination_lists_the_known_ones():
    with pytest.raises(InvalidSettingError, match=r"2\.5\.1/cuda12\.4") as excinfo:
        pytorch_image("1.0.0")
    assert excinfo.value.field == "torch/cuda"


def test_default_parent_image_is_in_the_catalogue():
    assert DEFAULT_PARENT_IMAGE in {image.tag() for image in CATALOGUE}


@pytest.mark.parametrize(
    ("reference", "env", "labels"),
    [
        ("pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime", [], {}),
        ("nvcr.io/nvidia/pytorch:24.10-py3", [], {}),
        ("nvidia/cuda:12.4.1-runtime-ubuntu22.04", [], {}),
        ("my-registry/train:1", ["PATH=/usr/bin", "CUDA_VERSION=12.4.1"], {}),
        ("my-registry/train:2", ["NVIDIA_VISIBLE_DEVICES=all"], {}),
        ("my-registry/train:3", [], {"com.nvidia.volumes.needed": "nvidia_driver"}),
    ],
)
def test_cuda_images_are_recognised(reference, env, labels):
    assert cpu_only_reason(reference, env, labels) is None


@pytest.mark.parametrize(
    ("reference", "env"),
    [
        ("python:3.11-slim", ["PATH=/usr/local/bin", "PYTHON_VERSION=3.11.9"]),
        ("airflow-gpu-base:bookworm", ["PATH=/usr/bin"]),
        ("my-registry/torch:2.5.1-cpu", ["CUDA_VERSION=12.4"]),  # the tag says CPU
    ],
)
def test_cpu_only_images_are_recognised(reference, env):
    assert cpu_only_reason(reference, env, {})
