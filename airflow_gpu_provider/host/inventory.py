"""The GPUs of a worker host: from NVML, or listed in ``[gpu] devices`` (hosts without NVML, tests, MIG UUIDs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_gpu_provider.exceptions import GpuUnavailableError, InvalidSettingError
from airflow_gpu_provider.runtime.protocol import format_bytes
from airflow_gpu_provider.settings.accelerators import (
    ACCELERATOR_PATTERN,
    MIG_PATTERN,
    NVIDIA,
    GpuVendor,
    card_memory_gib,
    mig_memory_gib,
    model_words,
)
from airflow_gpu_provider.settings.shares import GpuShare

if TYPE_CHECKING:
    from airflow_gpu_provider.settings import ResourceSettings

DEVICES_ACCEPTED = (
    "'auto' (NVML), 'none', or comma-separated device ids such as '0,1,2,3' or MIG UUIDs, each optionally with its "
    "model: '0=L4,1=A100-80GB' (a known model gives the device's memory), a MIG slice its profile: 'MIG-1=1g.10gb'"
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
        gib = mig_memory_gib(model) if MIG_PATTERN.fullmatch(model) else card_memory_gib(model) if model else None
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


def right_sized(candidates: Sequence[Device], need: int, log: Any) -> list[Device]:
    """A right-sized try's candidates (``right_size=True``): those known to hold ``need`` bytes, smallest first.

    The allocator takes the first free ones, so a smaller GPU or MIG slice that is busy gives way to a larger one
    that holds the peak too; when no candidate is known to hold it (memory unknown), all of them, as without.
    """
    holding = sorted((d for d in candidates if (d.memory_total or 0) >= need), key=lambda d: d.memory_total or 0)
    sizes = ", ".join(f"{d.name or d.id} ({format_bytes(d.memory_total)})" for d in holding) or "none"
    log.info("[gpu] right_size: this host's GPUs that hold %s, smallest first: %s", format_bytes(need), sizes)
    return holding or list(candidates)


def larger(
    candidates: Sequence[Device], present: Sequence[Device], minimum: int, *, requested: str, policy: Any, log: Any
) -> list[Device] | None:
    """A try after a GPU out-of-memory failure: the candidates with more memory than ``minimum``, smallest first.

    :param policy: the task's :class:`~airflow_gpu_provider.task.missing_gpu.MissingGpuPolicy`
    :return: ``None`` for a CPU fallback (there is none, and ``on_missing_gpu="cpu"``)
    :raises GpuUnavailableError: there is none
    """
    found = [d for d in candidates if d.memory_total is not None and d.memory_total > minimum]
    if not found and policy.runs_on_cpu:
        log.warning("Requested %s larger than the GPU that ran out of memory, but this host has none; "
                    "running on CPU (on_missing_gpu='cpu').", requested)  # fmt: skip
        return None
    if not found:
        sizes = {d.id: format_bytes(d.memory_total) if d.memory_total else "unknown memory" for d in present}
        raise GpuUnavailableError(
            f"Requested {requested} with more than {format_bytes(minimum)} of memory, after a try ran out of GPU "
            f"memory, but no GPU of this host has more ({', '.join(f'{i}: {m}' for i, m in sizes.items()) or 'none'})."
            " Give the task a smaller batch, an on_oom ladder of accelerators on Kubernetes, or list the GPUs' models "
            "in [gpu] devices (0=L4,1=A100-80GB) when NVML cannot tell their memory."
        )
    return sorted(found, key=lambda d: d.memory_total or 0)  # the smallest GPU that is larger


def right_sized_share(share: GpuShare, candidates: Sequence[Device], need: int, log: Any) -> GpuShare:
    """A right-sized try of a share (``right_size=True``): ``need`` bytes of a GPU, where one of them holds it."""
    if any((d.memory_total or 0) >= need for d in candidates):
        log.info("[gpu] right_size: a share of %s instead of %s", format_bytes(need), share.describe())
        return GpuShare(memory=need)
    log.info("[gpu] right_size: no GPU of this host holds %s: the share stays %s", format_bytes(need), share.describe())
    return share
