"""``ResourceSettings``: what a task needs, declared once, validated when the DAG is parsed."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_gpu_provider.dag_line import entry_point
from airflow_gpu_provider.exceptions import InvalidSettingError, UnknownSettingError
from airflow_gpu_provider.settings.accelerators import (
    ACCELERATOR_PATTERN,
    MIG_PATTERN,
    MODEL_VENDORS,
    NVIDIA,
    VENDORS,
    GpuVendor,
)
from airflow_gpu_provider.settings.grammar import DECIMAL
from airflow_gpu_provider.settings.shares import ALL_GPUS, MAX_GPUS, GpuCount, GpuShare, parse_count, parse_share
from airflow_gpu_provider.settings.units import (
    BYTES_ACCEPTED,
    CPU_ACCEPTED,
    MAX_BYTES,
    MIN_MEMORY,
    MIN_SHM,
    format_bytes,
    parse_bytes,
    parse_cpu,
)

_OWNER = "ResourceSettings"
_DECIMAL = DECIMAL  # "２", "٣" and "¹" are digits to str.isdigit(), not to Kubernetes


def _invalid(name: str, value: object, reason: str, accepted: str | None = None) -> InvalidSettingError:
    return InvalidSettingError(_OWNER, name, value, reason, accepted)


@dataclass(frozen=True)
class ResourceSettings:
    """Compute resources for one task. Immutable; every field is checked when the object is built.

    :param cpu_count: CPU cores (``4``, ``0.5``, ``"500m"``). Local: sets thread-count variables.
    :param gpu_count: number of GPUs (or MIG slices), ``"all"`` (local and Docker only), or a share of one GPU
        (``0.25``: local, Docker, Ray)
    :param gpu_share: a share of one GPU by its memory (``"8GiB"``): local and Docker place it on a GPU whose
        unpromised memory holds it (docs/sharing.md)
    :param memory: memory limit: integer bytes or ``"16GB"``, ``"16Gi"``, ``"512Mi"``
    :param accelerator: GPU model, e.g. ``"A100"``, ``"H100-80GB"``, or SkyPilot-style ``"A100:2"``,
        which also sets ``gpu_count``; or an ordered list of acceptable models, preferred first:
        ``["H100", "A100-80GB"]`` (kept as ``accelerator="H100"``, ``fallback_accelerators=("A100-80GB",)``)
    :param gpu_vendor: ``"nvidia"`` (default), ``"amd"``, ``"intel"``, ``"aws-neuron"``, ``"google-tpu"``,
        or a :class:`GpuVendor` for anything else
    :param mig_profile: NVIDIA MIG partition, e.g. ``"1g.10gb"``; ``gpu_count`` then counts slices
    :param shm_size: size of ``/dev/shm`` in containers and pods (bytes or a quantity string);
        ``None`` uses the backend's default
    :param fallback_accelerators: the models after ``accelerator`` in a list, in order (set by a list in
        ``accelerator``; replaced whenever ``accelerator`` is)
    """

    cpu_count: float | None = None
    gpu_count: GpuCount = 0
    memory: int | None = None
    accelerator: str | None = None
    gpu_vendor: GpuVendor = field(default=NVIDIA)
    mig_profile: str | None = None
    shm_size: int | None = None
    fallback_accelerators: tuple[str, ...] = ()
    gpu_share: int | str | None = None

    @entry_point()
    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        if self.cpu_count is not None:
            try:
                put("cpu_count", parse_cpu(self.cpu_count))
            except (TypeError, ValueError) as err:
                raise _invalid("cpu_count", self.cpu_count, str(err), CPU_ACCEPTED) from None

        for name, smallest in (("memory", MIN_MEMORY), ("shm_size", MIN_SHM)):
            value = getattr(self, name)
            if value is None:
                continue
            try:
                amount = parse_bytes(value)
            except (TypeError, ValueError) as err:
                raise _invalid(name, value, str(err), BYTES_ACCEPTED) from None
            if amount == 0 and name == "memory":
                raise _invalid(name, value, "a memory limit of zero bytes cannot run anything", BYTES_ACCEPTED)
            if not smallest <= amount <= MAX_BYTES:
                raise _invalid(
                    name,
                    value,
                    f"out of range ({format_bytes(smallest)} to {format_bytes(MAX_BYTES)}; None for the default)",
                    BYTES_ACCEPTED,
                )
            put(name, amount)

        vendor = self.gpu_vendor
        if isinstance(vendor, str):
            if vendor.lower() not in VENDORS:
                raise _invalid(
                    "gpu_vendor",
                    vendor,
                    "unknown vendor",
                    f"{', '.join(map(repr, VENDORS))}, or a GpuVendor(...) for another vendor",
                )
            vendor = VENDORS[vendor.lower()]
        elif not isinstance(vendor, GpuVendor):
            raise _invalid("gpu_vendor", vendor, "expected a vendor name or a GpuVendor", ", ".join(VENDORS))
        put("gpu_vendor", vendor)

        gpu_count = parse_count("gpu_count", self.gpu_count, allow_all=True)
        models = self._models()
        if models:
            parsed = [self._parse_accelerator(m) for m in models]
            counts = {count for _, count in parsed if count is not None}
            if len(counts) > 1:
                raise _invalid(
                    "accelerator", list(models), f"the models ask for different counts {sorted(counts)}",
                    "one count for every model of the list (or none: gpu_count)",
                )  # fmt: skip
            count = counts.pop() if counts else None
            if count is not None:
                if gpu_count not in (0, count):
                    raise _invalid(
                        "accelerator",
                        self.accelerator,
                        f"its count {count} contradicts gpu_count={gpu_count!r}",
                        "set the count in one place only",
                    )
                gpu_count = count
            elif gpu_count == 0:
                gpu_count = 1
            vendor = self._model_vendor(vendor, [model for model, _ in parsed])
            put("gpu_vendor", vendor)
            names = [model for model, _ in parsed]
            if len({n.upper() for n in names}) < len(names):
                raise _invalid("accelerator", list(models), "a model is listed twice", "each model once, in order")
            put("accelerator", names[0])
            put("fallback_accelerators", tuple(names[1:]))

        if self.mig_profile is not None:
            profile = str(getattr(self.mig_profile, "value", self.mig_profile))
            if not isinstance(self.mig_profile, str) or not MIG_PATTERN.fullmatch(profile):
                raise _invalid(
                    "mig_profile",
                    self.mig_profile,
                    "not a MIG profile name",
                    "'<compute>g.<memory>gb' such as '1g.10gb' or '3g.40gb' (MigProfile has the common ones)",
                )
            if not vendor.supports_mig:
                raise _invalid(
                    "mig_profile",
                    profile,
                    f"MIG partitions exist only on NVIDIA GPUs, not {vendor.name!r}",
                    "gpu_vendor='nvidia' with a MIG profile, or no mig_profile",
                )
            if gpu_count == ALL_GPUS:
                raise _invalid("gpu_count", gpu_count, "'all' cannot be combined with mig_profile", "an integer")
            if gpu_count == 0:
                gpu_count = 1
            put("mig_profile", profile)
        if self.gpu_share is not None:
            put("gpu_share", parse_share(self.gpu_share, gpu_count, self.mig_profile))
            gpu_count = 1  # a share of one GPU: a backend that cannot place shares would give it a whole one
        put("gpu_count", gpu_count)

    def _models(self) -> tuple[object, ...]:
        """The models as given: a list in ``accelerator``, or ``accelerator`` and ``fallback_accelerators``."""
        given: object = self.accelerator
        fallbacks: object = self.fallback_accelerators
        accepted = "a model name, or a list of them, preferred first: ['H100', 'A100-80GB']"
        if not isinstance(fallbacks, (list, tuple)) or (fallbacks and given is None):
            raise _invalid("fallback_accelerators", fallbacks, "expected the models after accelerator", accepted)
        if given is None:
            return ()
        if isinstance(given, str):
            return (given, *fallbacks)
        if not isinstance(given, Sequence) or not given:
            raise _invalid("accelerator", given, "expected a model name or a non-empty list of them", accepted)
        if fallbacks:
            raise _invalid("fallback_accelerators", fallbacks, "accelerator is already a list", "one list only")
        return tuple(given)

    @staticmethod
    def _model_vendor(vendor: GpuVendor, models: list[str]) -> GpuVendor:
        """The vendor of the models (one for all of them); an explicit, different ``gpu_vendor`` is an error."""
        found = {MODEL_VENDORS.get(m.upper(), vendor).name for m in models}
        if len(found) > 1:
            raise _invalid(
                "accelerator", models, f"the list mixes vendors ({', '.join(sorted(found))})",
                "models of one vendor: a pod asks for one vendor's devices",
            )  # fmt: skip
        model_vendor = MODEL_VENDORS.get(models[0].upper())
        if model_vendor is None or model_vendor.name == vendor.name:
            return vendor
        if vendor != NVIDIA:  # an explicit, different vendor; NVIDIA is the default
            raise _invalid(
                "accelerator",
                models[0] if len(models) == 1 else models,
                f"it is a {model_vendor.name} model but gpu_vendor={vendor.name!r}",
                f"gpu_vendor={model_vendor.name!r} or a {vendor.name} model",
            )
        return model_vendor

    @staticmethod
    def _parse_accelerator(value: object) -> tuple[str, int | None]:
        accepted = "a model name such as 'A100' or 'H100-80GB', optionally with a count: 'A100:2'"
        text = str(getattr(value, "value", value)) if isinstance(value, str) else None
        match = ACCELERATOR_PATTERN.fullmatch(text) if text is not None else None
        if match is None:
            raise _invalid("accelerator", value, "not an accelerator name", accepted)
        if match["count"] is None:
            return match["model"], None
        count = match["count"]
        if not _DECIMAL.fullmatch(count) or not 1 <= int(count) <= MAX_GPUS:
            raise _invalid("accelerator", value, f"the count {count!r} is not a positive integer", accepted)
        return match["model"], int(count)

    # ------------------------------------------------------------------ derived views
    @property
    def accelerators(self) -> tuple[str, ...]:
        """Every acceptable model, preferred first: ``accelerator`` then ``fallback_accelerators`` (or ``()``)."""
        return (self.accelerator, *self.fallback_accelerators) if self.accelerator else ()

    @property
    def requests_gpus(self) -> bool:
        """Whether the task asks for any accelerator."""
        return isinstance(self.gpu_count, str) or self.gpu_count > 0

    @property
    def share(self) -> GpuShare | None:
        """The share of one GPU asked for (``gpu_count=0.25`` or ``gpu_share``), or ``None`` for whole GPUs."""
        if self.gpu_share is not None:
            return GpuShare(memory=int(self.gpu_share))
        return GpuShare(fraction=self.gpu_count) if isinstance(self.gpu_count, float) else None

    def with_overrides(self, **overrides: Any) -> ResourceSettings:
        """Return a copy with some fields replaced, validated again (used for templated shortcuts)."""
        unknown = set(overrides) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise UnknownSettingError(_OWNER, unknown, (f.name for f in dataclasses.fields(self)))
        if "accelerator" in overrides and "gpu_count" not in overrides and self.accelerator is not None:
            overrides["gpu_count"] = 0  # the new accelerator string decides the count again
        if "accelerator" in overrides:
            overrides.setdefault("fallback_accelerators", ())  # a new accelerator (or list) replaces the list
        return dataclasses.replace(self, **overrides)

    def describe(self) -> str:
        """One line for logs: ``2x nvidia A100, 8 CPUs, 16.0 GiB memory``."""
        parts = []
        if self.gpu_count == ALL_GPUS:
            parts.append(f"all {self.gpu_vendor.name} {self.accelerator or 'GPU'}s")
        elif self.requests_gpus:
            what = " or ".join(self.accelerators) or "GPU"
            if self.mig_profile:
                what += f" MIG {self.mig_profile}"
            share = self.share
            count = f"{share.describe()} of 1x" if share is not None else f"{self.gpu_count}x"
            parts.append(f"{count} {self.gpu_vendor.name} {what}")
        else:
            parts.append("no GPU")
        if self.cpu_count is not None:
            parts.append(f"{self.cpu_count:g} CPUs")
        if self.memory is not None:
            parts.append(f"{format_bytes(self.memory)} memory")
        if self.shm_size is not None:
            parts.append(f"{format_bytes(self.shm_size)} shm")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """The settings as JSON values (the vendor by name): what a task finds in ``AIRFLOW_GPU_RESOURCES``.

        ``fallback_accelerators`` only for a list of models.
        """
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        values.pop("fallback_accelerators")
        if self.gpu_share is None:
            values.pop("gpu_share")
        if self.fallback_accelerators:
            values["fallback_accelerators"] = list(self.fallback_accelerators)
        return {**values, "gpu_vendor": self.gpu_vendor.name}

    def without_gpus(self) -> ResourceSettings:
        """The same request on the CPU only: what a task falls back to under ``on_missing_gpu="cpu"``."""
        return self.with_overrides(gpu_count=0, accelerator=None, mig_profile=None, gpu_share=None)
