"""The GPUs of a worker host: from NVML, or listed in ``[gpu] devices`` (hosts without NVML, tests, MIG UUIDs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.settings.accelerators import (
    ACCELERATOR_PATTERN,
    NVIDIA,
    GpuVendor,
    card_memory_gib,
    model_words,
)

if TYPE_CHECKING:
    from airflow_gpu_provider.settings import ResourceSettings

DEVICES_ACCEPTED = (
    "'auto' (NVML), 'none', or comma-separated device ids such as '0,1,2,3' or MIG UUIDs, each optionally with its "
    "model: '0=L4,1=A100-80GB' (a known model gives the device's memory)"
)
GIB = 2**30


@dataclass(frozen=True)
class Device:
    """One GPU (or MIG slice) that the allocator can hand out.

    :param id: what the visible-devices variable takes: an index, a GPU UUID or a MIG UUID
    :param name: model name when known (NVML), else ``None``
    """

    id: str
    name: str | None = None
    memory_total: int | None = None
    index: str | None = None  # NVML's index, when the id is its UUID: a task's devices may name either

    def describe(self) -> dict[str, object]:
        """The runtime's GPU-summary form."""
        return {"index": self.id, "name": self.name or "GPU (model unknown)", "memory_total": self.memory_total}


def parse_devices(option: str) -> list[Device] | None:
    """Parse ``[gpu] devices``: ``None`` for ``auto``, else the listed devices (``none`` is an empty list)."""
    text = option.strip()
    if text.lower() == "auto":
        return None
    if text.lower() in ("none", ""):
        return []
    parts = [part.strip().partition("=") for part in text.split(",")]
    ids = [device_id.strip() for device_id, _, _ in parts]
    if any(not part or any(c.isspace() for c in part) for part in ids) or len(set(ids)) != len(ids):
        raise InvalidSettingError(
            "[gpu]", "devices", option, "device ids must be distinct and non-empty", DEVICES_ACCEPTED
        )
    devices = []
    for device_id, given, text in parts:
        model = text.strip()
        if given and (not ACCELERATOR_PATTERN.fullmatch(model) or ":" in model):
            raise InvalidSettingError("[gpu]", "devices", option, f"{model!r} is not a model name", DEVICES_ACCEPTED)
        gib = card_memory_gib(model) if model else None
        devices.append(Device(device_id.strip(), model or None, None if gib is None else int(gib * GIB)))
    return devices


def host_devices(option: str, vendor: GpuVendor = NVIDIA) -> list[Device]:
    """The devices of this host for ``vendor``: the configured list, or NVML's NVIDIA GPUs for ``auto``."""
    configured = parse_devices(option)
    if configured is not None:
        return configured
    if vendor != NVIDIA:
        return []  # only NVIDIA GPUs are discovered; list other vendors' devices in [gpu] devices
    from airflow_gpu_provider.runtime.cuda import list_gpus  # the runtime's one NVML probe, when asked

    return [Device(g.get("uuid") or g["index"], g["name"], g["memory_total"], str(g["index"])) for g in list_gpus()]


def narrowed(devices: Sequence[Device], only: Sequence[str], configured: str) -> list[Device]:
    """The devices of ``devices`` that a task's ``devices`` option names (all of them for none), in its order.

    A task only narrows the host's GPUs: an id the host does not have is an error, never a GPU of the task's own.

    :param configured: ``[gpu] devices``, for the message
    :raises GpuUnavailableError: naming the ids the host lacks and the host's GPUs
    """
    if not only:
        return list(devices)
    by_id = {key: device for device in devices for key in (device.id, device.index) if key is not None}
    unknown = [device_id for device_id in only if device_id not in by_id]
    if unknown:
        from airflow_gpu_provider.exceptions import GpuUnavailableError

        raise GpuUnavailableError(
            f"backend_options devices {', '.join(map(repr, unknown))} are not GPUs of this host ([gpu] devices="
            f"{configured!r}: {', '.join(d.id for d in devices) or 'none'}). A task's devices only narrow the host's "
            "GPUs: name some of those, or leave devices out."
        )
    return list(dict.fromkeys(by_id[device_id] for device_id in only))


def matches_model(device: Device, model: str | None) -> bool:
    """Whether a device is of the requested model (``"H100-80GB"`` matches ``"NVIDIA H100 80GB HBM3"``).

    Devices of unknown model (configured by id) match any model.
    """
    if model is None or device.name is None:
        return True
    words = model_words(device.name)
    return all(token in words for token in model_words(model))


def matching(resources: ResourceSettings, present: Sequence[Device]) -> list[Device]:
    """The devices of ``present`` that match the request: any model of its list, a MIG slice for a MIG profile."""
    models = resources.accelerators or (None,)
    candidates = [d for d in present if any(matches_model(d, model) for model in models)]
    if resources.mig_profile is not None:
        candidates = [d for d in candidates if d.id.startswith("MIG-")]
    return candidates


def model_groups(resources: ResourceSettings, candidates: Sequence[Device]) -> list[list[Device]]:
    """The candidates of each model of a fallback list, preferred first (``[]`` for one model or none)."""
    if len(resources.accelerators) < 2:
        return []
    return [[d for d in candidates if matches_model(d, model)] for model in resources.accelerators]
