"""GPU vendors, named accelerator models and MIG profiles.

Constants show up in the IDE and typos fail at import; plain strings are still accepted for devices the constants
don't cover. A vendor the table lacks is one :class:`GpuVendor` instance away, with no global registry.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum

from airflow_gpu_provider.dag_line import entry_point
from airflow_gpu_provider.exceptions import InvalidSettingError
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

    @entry_point()
    def __post_init__(self) -> None:
        for field, grammar, accepted in (
            ("name", VENDOR_NAME, "lower-case letters, digits and '-', e.g. 'habana'"),
            ("k8s_resource", RESOURCE_NAME, "a Kubernetes extended resource name, e.g. 'habana.ai/gaudi'"),
            ("visible_devices_env", ENV_NAME, "an environment variable name, e.g. 'HABANA_VISIBLE_MODULES'"),
        ):
            if not grammar.fullmatch(str(getattr(self, field))):
                raise InvalidSettingError("GpuVendor", field, getattr(self, field), "not accepted", accepted)

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
    "MI100": AMD,
    "MI210": AMD,
    "MI250": AMD,
    "MI250X": AMD,
    "MI300A": AMD,
    "MI300X": AMD,
    "MI325X": AMD,
    "MAX-1100": INTEL,
    "MAX-1550": INTEL,
    "TRAINIUM": AWS_NEURON,
    "TRAINIUM2": AWS_NEURON,
    "INFERENTIA2": AWS_NEURON,
    "TPU-V4": GOOGLE_TPU,
    "TPU-V5E": GOOGLE_TPU,
    "TPU-V5P": GOOGLE_TPU,
    "TPU-V6E": GOOGLE_TPU,
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


# Other models a task may name (NVIDIA unless MODEL_VENDORS says otherwise); with the tables above, the models that
# ResourceSettings.accelerator accepts at parse. A deployment adds its own with [gpu] extra_accelerators.
_OTHER_MODELS = (
    *("K80", "P4", "P40", "P100", "V100-32GB", "A2", "A16", "A30", "A40", "A800", "L40", "H100-NVL", "H800"),
    *("GH200", "B100", "GB200", "A6000", "RTX-A6000", "RTX-6000-ADA", "RTX-4090", "RTX-3090"),
)
KNOWN_MODELS: frozenset[str] = frozenset(
    {*(a.value for a in Accelerator), *MODEL_VENDORS, *MEMORY_GIB, *_MEMORY_ALIASES, *_OTHER_MODELS}
)


# Words of a cloud's or a node label's name of a card that are not its model: GKE's ``nvidia-tesla-a100``, NVIDIA's
# ``nvidia.com/gpu.product`` (``NVIDIA-A100-SXM4-80GB``, ``Tesla-T4``), ``AMD-Instinct-MI300X``, ...
_NOT_MODEL_WORDS = frozenset(
    {"NVIDIA", "TESLA", "GEFORCE", "AMD", "INSTINCT", "INTEL", "DATA", "CENTER", "GPU", "MEGA", "PCIE", "HBM3"}
    | {"HBM3E", "HBM2", "HBM2E", "SXM", "SXM2", "SXM3", "SXM4", "SXM5"}
)


def cloud_model(name: str) -> str | None:
    """The model that a cloud's or a node label's name of a card names (``nvidia-tesla-a100``: ``A100``), if known.

    GKE's ``cloud.google.com/gke-accelerator`` values, NVIDIA GPU feature discovery's ``nvidia.com/gpu.product``,
    and the like: the vendor's and the form factor's words dropped, then the memory too when the table has no
    such size (``Tesla-V100-SXM2-16GB``: ``V100``).
    """
    words = [w for w in name.upper().replace("_", "-").replace(" ", "-").split("-") if w and w not in _NOT_MODEL_WORDS]
    for candidate in ("-".join(words), "-".join(w for w in words if not w.endswith("GB"))):
        if candidate in KNOWN_MODELS and candidate != name.upper():
            return candidate
    return None


def check_model(owner: str, model: str, also: Collection[str] = ()) -> None:
    """Refuse an accelerator model that is neither known nor one of ``also`` (the deployment's), naming both.

    A cloud's or a node label's name of a known model is refused naming the model (:func:`cloud_model`).

    :param also: the models the deployment adds: those of ``[gpu] devices`` and ``[gpu] extra_accelerators``
    """
    if model.upper() in KNOWN_MODELS or model.upper() in {m.upper() for m in also}:
        return
    named = cloud_model(model)
    if named is not None:
        raise InvalidSettingError(
            owner, "accelerator", model,
            f"a cloud's or a node label's name of the {named} (the provider names models as vendors sell them, and "
            "maps them to each platform's labels itself)",
            f"accelerator={named!r}",
        )  # fmt: skip
    import difflib

    close = difflib.get_close_matches(model.upper(), [*KNOWN_MODELS, *also], n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
    added = f"this deployment's {', '.join(sorted(also))}; " if also else ""
    raise InvalidSettingError(
        owner,
        "accelerator",
        model,
        f"not a known accelerator model ({hint}a typo would otherwise wait for, or fall back from, a GPU that "
        "never comes)",
        f"{', '.join(sorted(KNOWN_MODELS))}; {added}or a model that the deployment's [gpu] extra_accelerators "
        "(or [gpu] devices, as 0=MODEL) adds, optionally with a count: 'A100:2'",
    )


def model_words(model: str) -> list[str]:
    """The words a device name must contain to be of ``model`` (``"H100-80GB"``: ``H100`` and ``80GB``).

    The one rule of what a model name means on a device: the host inventory matches NVML's names with it, the DRA
    claim selects the driver's ``productName`` with it.
    """
    return model.upper().replace("-", " ").split()


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
