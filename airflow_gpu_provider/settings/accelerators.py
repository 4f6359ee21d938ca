"""GPU vendors, named accelerator models and MIG profiles.

Constants show up in the IDE and typos fail at import; plain strings are still accepted for devices the constants
don't cover. A vendor the table lacks is one :class:`GpuVendor` instance away, with no global registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from airflow_gpu_provider.settings.grammar import ACCELERATOR, ENV_NAME, MIG_PROFILE, RESOURCE_NAME, VENDOR_NAME


@dataclass(frozen=True)
class GpuVendor:
    """How one accelerator vendor is addressed.

    :param name: short name used in settings and logs, e.g. ``"nvidia"``
    :param k8s_resource: the Kubernetes extended resource, e.g. ``"nvidia.com/gpu"``
    :param visible_devices_env: environment variable that restricts a process to given device ids
    :param supports_mig: whether MIG partitions (``mig_profile``) exist for this vendor
    """

    name: str
    k8s_resource: str
    visible_devices_env: str
    supports_mig: bool = False

    def __post_init__(self) -> None:
        if not VENDOR_NAME.fullmatch(str(self.name)):
            raise ValueError(f"GpuVendor.name={self.name!r} must be lower-case letters, digits and '-'")
        if not RESOURCE_NAME.fullmatch(str(self.k8s_resource)):
            raise ValueError(f"GpuVendor.k8s_resource={self.k8s_resource!r} is not a resource name")
        if not ENV_NAME.fullmatch(str(self.visible_devices_env)):
            raise ValueError(f"GpuVendor.visible_devices_env={self.visible_devices_env!r} is not a variable name")

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        if VENDORS.get(self.name) == self:
            return f"GpuVendor({self.name!r})"
        return (
            f"GpuVendor(name={self.name!r}, k8s_resource={self.k8s_resource!r}, "
            f"visible_devices_env={self.visible_devices_env!r}, supports_mig={self.supports_mig!r})"
        )


def _known(name: str, k8s_resource: str, visible_devices_env: str, *, supports_mig: bool = False) -> GpuVendor:
    """A vendor of this table, built without the checks a user's ``GpuVendor(...)`` gets (its values are known)."""
    vendor = object.__new__(GpuVendor)
    for field, value in (("name", name), ("k8s_resource", k8s_resource), ("visible_devices_env", visible_devices_env)):
        object.__setattr__(vendor, field, value)
    object.__setattr__(vendor, "supports_mig", supports_mig)
    return vendor


NVIDIA = _known("nvidia", "nvidia.com/gpu", "CUDA_VISIBLE_DEVICES", supports_mig=True)
AMD = _known("amd", "amd.com/gpu", "ROCR_VISIBLE_DEVICES")
INTEL = _known("intel", "gpu.intel.com/i915", "ZE_AFFINITY_MASK")
AWS_NEURON = _known("aws-neuron", "aws.amazon.com/neuron", "NEURON_RT_VISIBLE_CORES")
GOOGLE_TPU = _known("google-tpu", "google.com/tpu", "TPU_VISIBLE_CHIPS")

VENDORS: dict[str, GpuVendor] = {v.name: v for v in (NVIDIA, AMD, INTEL, AWS_NEURON, GOOGLE_TPU)}


class Accelerator(str, Enum):
    """Well-known accelerator models. ``ResourceSettings(accelerator=Accelerator.A100_80GB)``."""

    T4 = "T4"
    V100 = "V100"
    A10 = "A10"
    A10G = "A10G"
    L4 = "L4"
    L40S = "L40S"
    A100 = "A100"
    A100_80GB = "A100-80GB"
    H100 = "H100"
    H100_80GB = "H100-80GB"
    H200 = "H200"
    B200 = "B200"
    MI250X = "MI250X"
    MI300X = "MI300X"
    MAX_1550 = "MAX-1550"
    TRAINIUM = "TRAINIUM"
    INFERENTIA2 = "INFERENTIA2"
    TPU_V5E = "TPU-V5E"

    def __str__(self) -> str:
        return self.value


# Models whose vendor is not NVIDIA; every other model defaults to the settings' gpu_vendor.
MODEL_VENDORS: dict[str, GpuVendor] = {
    "MI210": AMD,
    "MI250": AMD,
    "MI250X": AMD,
    "MI300X": AMD,
    "MAX-1100": INTEL,
    "MAX-1550": INTEL,
    "TRAINIUM": AWS_NEURON,
    "TRAINIUM2": AWS_NEURON,
    "INFERENTIA2": AWS_NEURON,
    "TPU-V4": GOOGLE_TPU,
    "TPU-V5E": GOOGLE_TPU,
    "TPU-V5P": GOOGLE_TPU,
}


# Memory of one card (GiB, as the vendor states it): what right-sizing advice compares a task's peak with.
MEMORY_GIB: dict[str, float] = {
    "T4": 16,
    "V100": 16,
    "A10": 24,
    "A10G": 24,
    "L4": 24,
    "L40S": 48,
    "A100": 40,
    "A100-80GB": 80,
    "H100": 80,
    "H200": 141,
    "B200": 180,
    "MI250X": 128,
    "MI300X": 192,
}
# Other names of the same cards (the Kubernetes label tables know both).
_MEMORY_ALIASES = {"A100-40GB": "A100", "H100-80GB": "H100", "H100-SXM": "H100", "H200-141GB": "H200"}


def card_memory_gib(model: str | None) -> float | None:
    """The memory of one card of ``model`` (GiB), or ``None`` when the table does not know it."""
    if model is None:
        return None
    name = model.upper()
    return MEMORY_GIB.get(_MEMORY_ALIASES.get(name, name))


# The MIG slices of each MIG-capable card (their memory is in their names: mig_memory_gib).
MIG_PROFILES: dict[str, tuple[str, ...]] = {
    "A100": ("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    "A100-80GB": ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H100": ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H200": ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
}


def mig_memory_gib(profile: str) -> float:
    """The memory of a MIG slice (GiB), from its name, as NVIDIA names them: ``"3g.40gb"`` has 40 GiB."""
    return float(str(profile).split(".")[1].removesuffix("+me").removesuffix("gb"))


class MigProfile(str, Enum):
    """Common NVIDIA MIG profiles (A100 40/80 GB, H100 80 GB, H200). Other ``<n>g.<m>gb`` strings work too."""

    P1G_5GB = "1g.5gb"
    P1G_10GB = "1g.10gb"
    P1G_18GB = "1g.18gb"
    P1G_20GB = "1g.20gb"
    P2G_10GB = "2g.10gb"
    P2G_20GB = "2g.20gb"
    P2G_35GB = "2g.35gb"
    P3G_20GB = "3g.20gb"
    P3G_40GB = "3g.40gb"
    P3G_71GB = "3g.71gb"
    P4G_20GB = "4g.20gb"
    P4G_40GB = "4g.40gb"
    P7G_40GB = "7g.40gb"
    P7G_80GB = "7g.80gb"

    def __str__(self) -> str:
        return self.value


ACCELERATOR_PATTERN, MIG_PATTERN = ACCELERATOR, MIG_PROFILE  # the names other modules know them by
