"""A GPU try's profile summary as Airflow metrics: through Airflow's own ``Stats``, where ``[metrics]`` sends them.

StatsD, Datadog's DogStatsD or OpenTelemetry, as ``[metrics]`` configures the worker (``statsd_on``,
``statsd_datadog_enabled``, ``otel_on``), with Airflow's own prefix, allow and block lists: the dashboards that show
Airflow's metrics show GPU use beside them. One set per try that was profiled (docs/telemetry.md, "Metrics"):

``gpu.task.tries`` (a count: one per profiled try); the gauges ``gpu.task.gpu_seconds`` (devices x seconds, 0 for
a CPU profile), ``gpu.task.utilization`` (the mean GPU utilisation, %), ``gpu.task.memory_utilization`` (the
highest peak memory of its GPUs, in % of the card), ``gpu.task.peak_memory`` (that peak, bytes) and
``gpu.task.energy`` (Wh, where the driver's counter or the power samples tell it).

Tagged ``dag_id``, ``task_id``, ``backend``, ``model`` (the GPU the try ran on, as NVML names it; ``cpu`` for a CPU
profile) and ``outcome`` (``success``, or the failure class: ``application``, ``resources``, ``infrastructure``;
``failed`` for an error of no GPU try). Plain StatsD has no tags: Airflow writes them into the name only with
``[metrics] statsd_influxdb_enabled``; DogStatsD and OpenTelemetry carry them as tags.
"""

from __future__ import annotations

import re
from typing import Any

from airflow_gpu_provider.telemetry.profile import Profile

PREFIX = "gpu.task"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")  # what a stat name (and a tag in it) may not hold


def tag(value: Any) -> str:
    """A tag value every metrics backend takes: ``NVIDIA GeForce RTX 4090`` -> ``NVIDIA_GeForce_RTX_4090``."""
    return _UNSAFE.sub("_", str(value)).strip("_")[:100] or "unknown"


def values(profile: Profile) -> dict[str, float]:
    """The gauges of one profile (those it knows)."""
    found: dict[str, float | None] = {"gpu_seconds": profile.gpu_seconds or 0.0}
    if not profile.is_cpu:
        energies = [device.energy_wh for device in profile.devices]
        found.update(
            utilization=profile.mean_util,
            memory_utilization=profile.peak_memory_pct,
            peak_memory=profile.peak_memory,
            energy=None if not energies or None in energies else sum(e or 0.0 for e in energies),
        )
    return {name: value for name, value in found.items() if value is not None}


def tags(profile: Profile, outcome: str) -> dict[str, str]:
    """The tags of a try's metrics: the task, its backend, the model it ran on, how it ended."""
    model = "cpu" if profile.is_cpu else next((d.name for d in profile.devices if d.name), "unknown")
    task = profile.task
    raw = {"dag_id": task.get("dag_id"), "task_id": task.get("task_id"), "backend": task.get("backend")}
    return {**{name: tag(value) for name, value in raw.items()}, "model": tag(model), "outcome": tag(outcome)}


def emit(profile: Profile, outcome: str, log: Any) -> None:
    """Send the try's metrics through Airflow's ``Stats``; a metrics backend in trouble costs one warning."""
    try:
        from airflow.providers.common.compat.sdk import Stats

        labels = tags(profile, outcome)
        Stats.incr(f"{PREFIX}.tries", tags=labels)
        for name, value in values(profile).items():
            Stats.gauge(f"{PREFIX}.{name}", value, tags=labels)
    except Exception as err:  # noqa: BLE001 - a task never fails for its metrics
        log.warning("[gpu] The try's metrics could not be sent: %s: %s", type(err).__name__, err)
