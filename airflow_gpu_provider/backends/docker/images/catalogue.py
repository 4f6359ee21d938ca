"""Official PyTorch CUDA images by torch and CUDA version, and telling a CUDA image from a CPU-only one.

Every tag below is an official ``pytorch/pytorch`` image (``<torch>-cuda<cuda>-cudnn<cudnn>-runtime``, plus a
``-devel`` twin with the CUDA compiler). Pick one with :func:`pytorch_image` (``from airflow_gpu_provider import
pytorch_image``)::

    ImageSettings(parent_image=pytorch_image("2.5.1", cuda="12.4"))
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from packaging.version import Version

from airflow_gpu_provider.exceptions import InvalidSettingError

Flavor = Literal["runtime", "devel"]


@dataclass(frozen=True)
class CudaImage:
    """One official PyTorch image: its torch, CUDA and cuDNN versions."""

    torch: str
    cuda: str
    cudnn: str

    def tag(self, flavor: Flavor = "runtime") -> str:
        """The image reference, e.g. ``pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime``."""
        return f"pytorch/pytorch:{self.torch}-cuda{self.cuda}-cudnn{self.cudnn}-{flavor}"


CATALOGUE: tuple[CudaImage, ...] = (
    CudaImage("2.9.0", "12.8", "9"),
    CudaImage("2.8.0", "12.8", "9"),
    CudaImage("2.7.1", "12.8", "9"),
    CudaImage("2.7.1", "12.6", "9"),
    CudaImage("2.7.1", "11.8", "9"),
    CudaImage("2.6.0", "12.6", "9"),
    CudaImage("2.6.0", "12.4", "9"),
    CudaImage("2.5.1", "12.4", "9"),
    CudaImage("2.5.1", "12.1", "9"),
    CudaImage("2.4.1", "12.4", "9"),
    CudaImage("2.4.1", "12.1", "9"),
    CudaImage("2.3.1", "12.1", "8"),
)
"""Known official tags, newest first. The default parent image (``DEFAULT_PARENT_IMAGE``) is one of them."""


def pytorch_image(torch: str, cuda: str | None = None, *, flavor: Flavor = "runtime") -> str:
    """The official PyTorch image for a torch version (and CUDA version; default: the newest CUDA listed).

    :raises InvalidSettingError: for a combination the catalogue does not list, naming the ones it does.
    """
    matches = [image for image in CATALOGUE if image.torch == torch and cuda in (None, image.cuda)]
    if flavor not in ("runtime", "devel"):
        raise InvalidSettingError("pytorch_image", "flavor", flavor, "unknown flavor", "'runtime' or 'devel'")
    if not matches:
        known = ", ".join(f"{image.torch}/cuda{image.cuda}" for image in CATALOGUE)
        raise InvalidSettingError(
            "pytorch_image",
            "torch/cuda",
            f"{torch}/{cuda or 'any'}",
            "not in the catalogue of official pytorch/pytorch CUDA images",
            f"{known}; or set parent_image to any image reference",
        )
    return max(matches, key=lambda image: Version(image.cuda)).tag(flavor)


# Official CUDA images (nvidia/cuda, pytorch/pytorch, NGC) carry at least one of these.
CUDA_ENV_MARKERS: tuple[str, ...] = ("CUDA_VERSION", "NVIDIA_REQUIRE_CUDA", "NVIDIA_VISIBLE_DEVICES")
CUDA_LABEL_MARKERS: tuple[str, ...] = ("com.nvidia.volumes.needed", "com.nvidia.cuda.version")
CUDA_NAME_MARKERS: tuple[str, ...] = ("cuda", "nvidia", "nvcr.io")


def cpu_only_reason(
    reference: str, environment: Iterable[str] = (), labels: Mapping[str, str] | None = None
) -> str | None:
    """Why an image looks CPU-only, or ``None`` when it looks CUDA-capable.

    :param environment: the image's ``Config.Env`` (``NAME=value`` strings), when it was inspected
    :param labels: the image's ``Config.Labels``
    """
    name = reference.lower()
    tag = name.rsplit(":", 1)[-1] if ":" in name.rsplit("/", 1)[-1] else ""
    if "cpu" in tag.replace("_", "-").split("-"):
        return f"its tag {tag!r} names a CPU build"
    if any(marker in name for marker in CUDA_NAME_MARKERS):
        return None
    names = {entry.split("=", 1)[0] for entry in environment}
    if names & set(CUDA_ENV_MARKERS) or set(labels or {}) & set(CUDA_LABEL_MARKERS):
        return None
    return f"it sets none of {', '.join(CUDA_ENV_MARKERS)} and its name mentions no CUDA"
