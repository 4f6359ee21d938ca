"""The ``on_oom`` escalation history of a task instance as a timeline: one row per try, in words.

The history is what ``escalation/tries.py`` records when a try ends (``record``): the try number, how it ended, the
resources it ran with, when (epoch seconds), and after a GPU out-of-memory failure the GPU's model and memory. Each
field is checked as it is read: a value of the wrong type shows as unknown, never as raw JSON.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timezone, tzinfo
from typing import Any, NamedTuple

from airflow_gpu_provider.telemetry.profile import number, text
from airflow_gpu_provider.telemetry.ui.format import gib, requested
from airflow_gpu_provider.telemetry.ui.html import e, table

CHANGED = (("accelerator", "accelerator"), ("mig_profile", "MIG"), ("gpu_count", "GPUs"), ("memory", "memory"))


class Step(NamedTuple):
    """One try of the history, checked."""

    number: int | None
    kind: str
    at: float | None
    resources: Mapping[str, Any]
    gpu_memory: float | None
    gpu_model: str
    error: str

    @classmethod
    def read(cls, entry: Mapping[str, Any]) -> Step:
        """Build from one history entry (a dict as ``tries.record`` wrote it)."""
        value = entry.get("try")
        resources = entry.get("resources")
        return cls(
            number=value if isinstance(value, int) and not isinstance(value, bool) else None,
            kind=text(entry.get("kind"), 20),
            at=number(entry.get("at")),
            resources=resources if isinstance(resources, dict) else {},
            gpu_memory=number(entry.get("gpu_memory")),
            gpu_model=text(entry.get("gpu_model"), 80),
            error=text(entry.get("error"), 300),
        )


def iso(epoch: float | None, zone: tzinfo) -> str:
    """Epoch seconds in ISO 8601, in ``zone`` with its offset (``2026-11-23 14:40:12+01:00``), or ``"–"``."""
    if epoch is None:
        return "–"
    try:
        return datetime.fromtimestamp(epoch, tz=zone).isoformat(sep=" ", timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return "–"


def outcome(step: Step) -> str:
    """How the try ended, in words."""
    if step.kind == "gpu_oom":
        on = f" on {step.gpu_model}" if step.gpu_model else ""
        size = f" ({gib(step.gpu_memory)})" if step.gpu_memory is not None else ""
        return f"ran out of GPU memory{on}{size}"
    if step.kind == "host_oom":
        limit = number(step.resources.get("memory"))
        return "ran out of host memory" + (f" (limit {gib(limit)})" if limit is not None else "")
    if step.kind == "success":
        return "succeeded"
    return "failed" + (f": {step.error}" if step.error else "") + " (not a memory error: retried unchanged)"


def _shown(field: str, value: Any) -> str:
    if value is None:
        return "none" if field == "mig_profile" else "not set"
    if field == "memory":
        amount = number(value)
        return gib(amount) if amount is not None else text(value, 20)
    return text(value, 40)


def change(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """What the next try asked for differently: ``accelerator L4 → A100-80GB; memory 64.0 MiB → 512.0 MiB``."""
    changes = [
        f"{label} {_shown(field, before.get(field))} → {_shown(field, after.get(field))}"
        for field, label in CHANGED
        if before.get(field) != after.get(field)
    ]
    return "; ".join(changes) or "unchanged"


def render_timeline(on_oom: str, entries: Sequence[Mapping[str, Any]], *, zone: tzinfo = timezone.utc) -> str:
    """The timeline's HTML: a table, oldest try first (``zone``: the time zone the times are shown in)."""
    steps = sorted((Step.read(entry) for entry in entries), key=lambda step: (step.number or 0, step.at or 0))
    rows = []
    for position, step in enumerate(steps):
        after = steps[position + 1] if position + 1 < len(steps) else None
        rows.append(
            [
                e(step.number if step.number is not None else "?"),
                f'<span class="nowrap">{e(iso(step.at, zone))}</span>',
                e(outcome(step)),
                e(requested(dict(step.resources))),
                e(change(step.resources, after.resources) if after else "–"),
            ]
        )
    ladder = f'<p class="meta">On out of memory: {e(on_oom)}.</p>' if on_oom else ""
    headers = ["Try", "Ended", "How it ended", "Ran with", "The next try"]
    return ladder + table(headers, rows) if rows else ""
