"""The one profile schema: a task try's profile as the runtime's sampler writes it, read defensively.

The runtime (``runtime/telemetry/``) samples the task's devices and returns a dict with the result envelope (schema
version :data:`PROFILE_VERSION`, docs/telemetry.md); the worker completes it (``report.py``: the task, what it asked
for, advice, cost) and stores it in XCom under ``gpu_profile`` and, per try, in the task state store. Every reader
goes through :meth:`Profile.read`: the advice, the cost, the log lines, the OpenLineage facet and the UI. Whatever a
task pushed under that key (a string, a half-filled dict) reads as "no profile" or as a profile with the missing
values blank, never as an error.

Version 2 added ``node`` (where the sampler ran; ``host`` is now the worker's host name as Airflow knows it),
``host_cpu`` (the host's CPU pressure) and ``cpu_fallback`` / ``cpu_fallback_reason``. A version 1 profile reads
with ``node`` blank, no ``host_cpu`` and no fallback.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from airflow_gpu_provider.runtime.protocol import PROFILE_VERSION

SUPPORTED_VERSIONS = (1, PROFILE_VERSION)
MAX_POINTS = 600  # the sampler sends at most this many; more are cut, never drawn


def number(value: Any) -> float | None:
    """A finite float, or None for anything else (bools, strings, NaN included)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def text(value: Any, limit: int = 500) -> str:
    """A string of at most ``limit`` characters; None becomes ``""``."""
    return "" if value is None else str(value)[:limit]


def numbers(value: Any) -> list[float | None]:
    """A series: a list of numbers (None where a sample is missing), at most ``MAX_POINTS`` long."""
    return [number(item) for item in value[:MAX_POINTS]] if isinstance(value, list) else []


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any, limit: int) -> list[Any]:
    return value[:limit] if isinstance(value, list) else []


@dataclass(frozen=True)
class Device:
    """One device's summary (a GPU, or the task's process tree for a CPU profile)."""

    index: str
    name: str
    uuid: str
    memory_total: float | None
    mean_util: float | None
    p95_util: float | None
    peak_memory: float | None
    peak_memory_pct: float | None
    energy_wh: float | None
    idle_s: float | None
    peak_power_w: float | None
    max_temperature_c: float | None

    @classmethod
    def read(cls, value: Any) -> Device:
        """Build from one ``devices`` entry."""
        raw = _mapping(value)
        get = {key: number(raw.get(key)) for key in cls.__dataclass_fields__ if key not in ("index", "name", "uuid")}
        return cls(
            index=text(raw.get("index"), 40), name=text(raw.get("name"), 120), uuid=text(raw.get("uuid"), 80), **get
        )


@dataclass(frozen=True)
class HostCpu:
    """How busy the host's CPUs were over the try (``runtime/telemetry/pressure.py``).

    :param source: the file read: ``/proc/pressure/cpu`` (PSI) or ``/proc/loadavg`` (where PSI is absent)
    :param scope: ``host`` (the kernel's view, a container's too), or ``container (...)`` where the file was a
        per-container view mounted over the host's (LXCFS)
    :param pressure_pct: the share of the try in which runnable tasks waited for a CPU (PSI ``some``); from the
        load average, ``1 - CPUs / load`` averaged over the samples
    :param peak_avg10: PSI's highest 10-second average seen; :param load_per_cpu: the load average per CPU
    """

    source: str
    scope: str
    pressure_pct: float | None
    peak_avg10: float | None = None
    load_per_cpu: float | None = None
    cpus: float | None = None

    @classmethod
    def read(cls, value: Any) -> HostCpu | None:
        """Build from the profile's ``host_cpu``; None when there is none."""
        raw = _mapping(value)
        source = text(raw.get("source"), 200)
        if not source:
            return None
        return cls(
            source=source,
            scope=text(raw.get("scope"), 80) or "host",
            pressure_pct=number(raw.get("pressure_pct")),
            peak_avg10=number(raw.get("peak_avg10")),
            load_per_cpu=number(raw.get("load_per_cpu")),
            cpus=number(raw.get("cpus")),
        )

    @property
    def from_psi(self) -> bool:
        """Read from PSI (else from the load average)."""
        return "pressure" in self.source

    def describe(self) -> str:
        """``CPU pressure 55 %`` or ``load 1.6 per CPU``."""
        if not self.from_psi and self.load_per_cpu is not None:
            return f"load {self.load_per_cpu:.1f} per CPU"
        return f"CPU pressure {self.pressure_pct or 0:.0f} %"


@dataclass(frozen=True)
class Series:
    """One device's samples, aligned with :attr:`Profile.times`."""

    util: list[float | None] = field(default_factory=list)
    memory_used: list[float | None] = field(default_factory=list)


@dataclass(frozen=True)
class Share:
    """The share of one GPU a try held: how much, of which GPU, enforced how (``host/mps.py``)."""

    memory: float | None
    percent: float | None
    gpu: str
    enforcement: str
    line: str

    @classmethod
    def read(cls, value: Any) -> Share | None:
        """From a profile's ``share`` (``None``: the try held whole GPUs)."""
        raw = _mapping(value)
        if not raw:
            return None
        fields = ("gpu", "enforcement", "line")
        return cls(number(raw.get("memory")), number(raw.get("percent")), *(text(raw.get(f), 300) for f in fields))


@dataclass(frozen=True)
class Profile:
    """One task try's profile, as the pages need it."""

    kind: str  # "gpu" or "cpu"
    host: str
    interval_s: float | None
    started: float | None
    duration_s: float | None
    samples: int
    devices: tuple[Device, ...]
    times: list[float | None]
    series: dict[str, Series]
    task: dict[str, Any]
    requested: dict[str, Any]
    gpu_seconds: float | None
    advice: tuple[str, ...]
    cost: dict[str, Any] | None
    error: str = ""  # the sampler's own trouble: the profile is incomplete
    right_size: str = ""  # a right-sized try (right_size=True): the decision, its evidence and the GPU it got
    node: str = ""  # where the sampler ran as it names itself: a container's id, a pod's name ("" in version 1)
    host_cpu: HostCpu | None = None
    cpu_fallback: bool = False  # on_missing_gpu="cpu" was taken: the task ran on the CPU instead of its GPUs
    cpu_fallback_reason: str = ""
    share: Share | None = None  # a share of one GPU (gpu_count=0.25, gpu_share): its size and enforcement

    @property
    def try_number(self) -> int | None:
        """The try this profile is of (``task.try_number``), when known."""
        value = self.task.get("try_number")
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    @property
    def is_cpu(self) -> bool:
        """A CPU profile: the host had no GPU (or no NVML); util is CPU % and memory is RSS."""
        return self.kind == "cpu"

    @property
    def finished(self) -> float | None:
        """Epoch seconds of the last sample."""
        if self.started is None:
            return None
        return self.started + (self.duration_s or 0.0)

    @property
    def peak_memory(self) -> float | None:
        """The highest peak memory over the devices."""
        peaks = [d.peak_memory for d in self.devices if d.peak_memory is not None]
        return max(peaks) if peaks else None

    @property
    def peak_memory_pct(self) -> float | None:
        """The highest peak memory over the devices, in % of its card."""
        peaks = [d.peak_memory_pct for d in self.devices if d.peak_memory_pct is not None]
        return max(peaks) if peaks else None

    @property
    def mean_util(self) -> float | None:
        """The mean of the devices' mean utilisation."""
        values = [d.mean_util for d in self.devices if d.mean_util is not None]
        return sum(values) / len(values) if values else None

    @classmethod
    def read(cls, value: Any) -> Profile | None:
        """Build from an XCom value; None when it is not a profile of a supported version."""
        raw = _mapping(value)
        if raw.get("version") not in SUPPORTED_VERSIONS:
            return None
        raw_series = _mapping(raw.get("series"))
        raw_devices = [item for item in _list(raw.get("devices"), 64) if isinstance(item, dict)]
        devices = tuple(Device.read(item) for item in raw_devices)
        series = {}
        for device, item in zip(devices, raw_devices, strict=True):
            samples = _mapping(raw_series.get(text(item.get("index"))))
            series[device.index] = Series(
                util=numbers(samples.get("util")), memory_used=numbers(samples.get("memory_used"))
            )
        cost = raw.get("cost")
        return cls(
            kind="cpu" if raw.get("kind") == "cpu" else "gpu",
            host=text(raw.get("host"), 200),
            interval_s=number(raw.get("interval_s")),
            started=number(raw.get("started")),
            duration_s=number(raw.get("duration_s")),
            samples=int(number(raw.get("samples")) or 0),
            devices=devices,
            times=numbers(raw_series.get("t")),
            series=series,
            task=_mapping(raw.get("task")),
            requested=_mapping(raw.get("requested")),
            gpu_seconds=number(raw.get("gpu_seconds")),
            advice=tuple(text(item) for item in _list(raw.get("advice"), 20) if isinstance(item, str)),
            cost=cost if isinstance(cost, dict) else None,
            error=text(raw.get("error")),
            right_size=text(_mapping(raw.get("right_size")).get("line")),
            node=text(raw.get("node"), 200),
            host_cpu=HostCpu.read(raw.get("host_cpu")),
            cpu_fallback=raw.get("cpu_fallback") is True,
            cpu_fallback_reason=text(raw.get("cpu_fallback_reason")) if raw.get("cpu_fallback") is True else "",
            share=Share.read(raw.get("share")),
        )
