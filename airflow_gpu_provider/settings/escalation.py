"""``OomEscalation``: what the next try of a task asks for after it ran out of memory. Pure and validated.

A ladder lists the steps *above* the task's own resources, smallest first; the task's own accelerator (MIG profile,
memory) may be its first entry. After a GPU out-of-memory failure the next try takes the whole GPU of a share, the
next MIG profile, then the next accelerator; after a host out-of-memory failure (a container or pod OOM-killed, Python's
``MemoryError``), the next memory step. Every other failure retries unchanged. On the local and Docker backends a
try after a GPU OOM also needs a GPU with more memory than the one that failed (``TaskRequest.min_gpu_memory``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from airflow_gpu_provider.dag_line import entry_point
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.settings.accelerators import ACCELERATOR_PATTERN, MIG_PATTERN, card_memory_gib, mig_memory_gib
from airflow_gpu_provider.settings.resources import ResourceSettings
from airflow_gpu_provider.settings.units import BYTES_ACCEPTED, format_bytes

_OWNER = "OomEscalation"


def _ladder(name: str, values: object, accepted: str) -> tuple[Any, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise InvalidSettingError(_OWNER, name, values, "expected a list, smallest step first", accepted)
    return tuple(getattr(v, "value", v) for v in values)  # Accelerator / MigProfile enums by their value


def _rising(name: str, values: Sequence[Any], sizes: Sequence[float], *, strict: bool = True) -> None:
    """Each step has more memory than the one before (or, ``strict=False``, as much on another model)."""
    for i in range(1, len(values)):
        (low, a), (high, b) = (sizes[i - 1], values[i - 1]), (sizes[i], values[i])
        if high < low or (high == low and (strict or str(a).upper() == str(b).upper())):
            raise InvalidSettingError(
                _OWNER, name, list(values), f"the ladder does not go up: {b} ({high:g} GiB) after {a} ({low:g} GiB)",
                "steps of more memory, smallest first" + ("" if strict else " (another model of as much memory too)"),
            )  # fmt: skip


@dataclass(frozen=True)
class OomEscalation:
    """The ladder a task climbs, one step per out-of-memory failure: ``on_oom=OomEscalation(...)``.

    :param accelerators: models with more GPU memory, smallest first: ``["L4", "A100-40GB", "A100-80GB", "H100"]``
        (a model of as much memory may follow: a faster card)
    :param mig_profiles: MIG slices with more memory, smallest first: ``["1g.10gb", "3g.40gb", "7g.80gb"]``
        (climbed before ``accelerators``; the step to a whole card drops the MIG profile)
    :param memory: host memory limits, smallest first (``["16Gi", "32Gi"]``): container and pod memory
    """

    accelerators: Sequence[str] = ()
    mig_profiles: Sequence[str] = ()
    memory: Sequence[int | str] = ()

    @entry_point()
    def __post_init__(self) -> None:
        models = _ladder("accelerators", self.accelerators, "accelerator names such as ['L4', 'A100-80GB', 'H100']")
        for model in models:
            if not isinstance(model, str) or not ACCELERATOR_PATTERN.fullmatch(model) or ":" in model:
                raise InvalidSettingError(_OWNER, "accelerators", model, "not an accelerator name", "'A100-80GB'")
            if card_memory_gib(model) is None:
                raise InvalidSettingError(
                    _OWNER, "accelerators", model, "unknown accelerator: its memory is not known, so the ladder "
                    "cannot be checked", "a model of MEMORY_GIB (settings/accelerators.py): 'L4', 'A100-80GB', 'H100'",
                )  # fmt: skip
        _rising("accelerators", models, [card_memory_gib(m) or 0.0 for m in models], strict=False)
        profiles = _ladder("mig_profiles", self.mig_profiles, "MIG profile names such as ['1g.10gb', '3g.40gb']")
        for profile in profiles:
            if not isinstance(profile, str) or not MIG_PATTERN.fullmatch(profile):
                raise InvalidSettingError(_OWNER, "mig_profiles", profile, "not a MIG profile name", "'3g.40gb'")
        _rising("mig_profiles", profiles, [mig_memory_gib(p) for p in profiles])
        amounts = _ladder("memory", self.memory, f"memory limits, smallest first: {BYTES_ACCEPTED}")
        try:  # the same parsing and bounds as ResourceSettings.memory
            limits = tuple(ResourceSettings(memory=amount).memory or 0 for amount in amounts)
        except InvalidSettingError as err:
            raise InvalidSettingError(_OWNER, "memory", err.value, err.reason, err.accepted) from None
        _rising("memory", [format_bytes(m) for m in limits], [m / 2**30 for m in limits])  # fmt: skip
        object.__setattr__(self, "accelerators", models)
        object.__setattr__(self, "mig_profiles", profiles)
        object.__setattr__(self, "memory", limits)

    # ------------------------------------------------------------------ the steps above a task's resources
    def gpu_steps(self, resources: ResourceSettings) -> list[dict[str, Any]]:
        """The resource changes after each GPU OOM, in order: a share's whole GPU or MIG slices first, then cards."""
        steps: list[dict[str, Any]] = []
        if resources.share is not None:  # a share of a GPU climbs back to the whole GPU first
            steps.append({"gpu_count": 1, "gpu_share": None})
        if resources.mig_profile is not None:
            slice_gib = mig_memory_gib(resources.mig_profile)
            steps += [{"mig_profile": p} for p in self.mig_profiles if mig_memory_gib(p) > slice_gib]
        # A fallback list is climbed from its largest card: the task may have run on any model of it. A step
        # names one model, which replaces the list (ResourceSettings.with_overrides).
        names = [m.upper() for m in self.accelerators]
        own = [names.index(m.upper()) for m in resources.accelerators if m.upper() in names]
        if own:  # the ladder names the task's own card(s): the steps after the highest of them
            cards = list(self.accelerators[max(own) + 1 :])
        else:
            cards_gib = [card_memory_gib(m) for m in resources.accelerators]
            known = [gib for gib in cards_gib if gib is not None]
            own_card = max(known) if known and len(known) == len(cards_gib) else None
            cards = [m for m in self.accelerators if own_card is None or (card_memory_gib(m) or 0) > own_card]
        return steps + [{"accelerator": m, "mig_profile": None} for m in cards]

    @property
    def limits(self) -> tuple[int, ...]:
        """The memory ladder in bytes."""
        return tuple(int(m) for m in self.memory)

    def memory_steps(self, resources: ResourceSettings) -> list[dict[str, Any]]:
        """The resource changes after each host OOM, in order."""
        return [{"memory": m} for m in self.limits if resources.memory is None or m > resources.memory]

    def check(self, resources: ResourceSettings, *, owner: str) -> None:
        """At DAG parse: a ladder must lead somewhere from the task's own resources."""
        if self.accelerators and not self.gpu_steps(resources) and not self.mig_profiles:
            raise InvalidSettingError(
                owner, "on_oom.accelerators", list(self.accelerators),
                f"no step has more memory than the task's own accelerator {resources.accelerator!r}",
                "models with more memory than the task's own",
            )  # fmt: skip
        if self.memory and not self.memory_steps(resources):
            raise InvalidSettingError(
                owner, "on_oom.memory", [format_bytes(m) for m in self.limits],
                f"no step is above the task's own memory {format_bytes(resources.memory or 0)}",
                "limits larger than the task's memory",
            )  # fmt: skip

    def climb(self, resources: ResourceSettings, gpu_ooms: int, host_ooms: int) -> tuple[ResourceSettings, str | None]:
        """The resources after ``gpu_ooms`` GPU and ``host_ooms`` host OOMs, and what is exhausted (or ``None``).

        Past the top of a ladder the resources stay on its last step.
        """
        gpu, memory = self.gpu_steps(resources), self.memory_steps(resources)
        changes: dict[str, Any] = {}
        for step in gpu[: min(gpu_ooms, len(gpu))]:
            changes.update(step)
        for step in memory[: min(host_ooms, len(memory))]:
            changes.update(step)
        if "accelerator" in changes:
            changes["gpu_count"] = changes.get("gpu_count", resources.gpu_count)  # a new model, the same count
        climbed = resources.with_overrides(**changes) if changes else resources
        exhausted = None
        if gpu_ooms > len(gpu) and (self.accelerators or self.mig_profiles):
            exhausted = "GPU"
        elif host_ooms > len(memory):
            exhausted = "memory"
        return climbed, exhausted

    def describe(self) -> str:
        """One line for logs."""
        parts = [f"{name}={' -> '.join(map(str, values))}" for name, values in (
            ("mig_profiles", self.mig_profiles), ("accelerators", self.accelerators),
            ("memory", [format_bytes(m) for m in self.limits]),
        ) if values]  # fmt: skip
        return ", ".join(parts) or "a GPU with more memory on the same host"
