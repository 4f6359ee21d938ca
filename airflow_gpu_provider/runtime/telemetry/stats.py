"""Per-device statistics of a profile, exact over every sample, and the thinning of its series."""

from __future__ import annotations

from typing import Any

IDLE_UTILISATION = 10.0  # below this (%), a GPU counts as idle
METRICS = ("util", "memory_used", "power_w", "temperature_c", "sm_clock_mhz")  # a sample's row, per device
PEAK_METRICS = frozenset({"memory_used", "temperature_c"})  # merged by max when the series is thinned; others mean


class Stats:
    """Exact per-device statistics over every sample (the series is thinned; these are not)."""

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.histogram = [0] * 101  # utilisation, by whole percent: an exact p95 in constant memory
        self.idle_s = 0.0
        self.peak_memory: float | None = None
        self.peak_power: float | None = None
        self.max_temperature: float | None = None
        self.energy_j = 0.0

    def add(self, row: list[float | None], seconds: float) -> None:
        """One sample (a row of :data:`METRICS`), which stood for ``seconds``."""
        util, used, power, temperature, _ = row
        if util is not None:
            self.count += 1
            self.total += util
            self.histogram[min(100, max(0, round(util)))] += 1
            if util < IDLE_UTILISATION:
                self.idle_s += seconds
        self.peak_memory = larger(self.peak_memory, used)
        self.peak_power = larger(self.peak_power, power)
        self.max_temperature = larger(self.max_temperature, temperature)
        if power is not None:
            self.energy_j += power * seconds

    def summary(self, memory_total: float | None, joules: float | None) -> dict[str, Any]:
        """The device's figures in the profile (``joules``: its energy over the task, if known)."""
        peak = self.peak_memory
        return {
            "mean_util": None if not self.count else round(self.total / self.count, 1),
            "p95_util": self.percentile(0.95),
            "peak_memory": None if peak is None else int(peak),
            "peak_memory_pct": round(100 * peak / memory_total, 1) if memory_total and peak is not None else None,
            "energy_wh": None if joules is None else round(joules / 3600, 4),
            "idle_s": round(self.idle_s, 1),
            "peak_power_w": self.peak_power,
            "max_temperature_c": self.max_temperature,
        }

    def percentile(self, fraction: float) -> float | None:
        """The utilisation at ``fraction`` (nearest rank), ``None`` without a sample."""
        if not self.count:
            return None
        rank, seen = fraction * self.count, 0
        for value, hits in enumerate(self.histogram):
            seen += hits
            if seen >= rank:
                return float(value)
        return 100.0


def larger(a: float | None, b: float | None) -> float | None:
    """The larger of two values, either of which may be unknown."""
    return b if a is None else a if b is None else max(a, b)


def merge(points: list[list[float | None]]) -> list[float | None]:
    """One point for several: the first time, the max of peak metrics, the mean of the others."""
    merged: list[float | None] = [points[0][0]]
    for column in range(1, len(points[0])):
        values = [p[column] for p in points if p[column] is not None]
        if not values:
            merged.append(None)
        elif METRICS[(column - 1) % len(METRICS)] in PEAK_METRICS:
            merged.append(max(values))  # type: ignore[type-var]
        else:
            merged.append(sum(values) / len(values))  # type: ignore[arg-type]
    return merged


def combine(
    first: list[list[float | None]], first_s: float, second: list[list[float | None]], second_s: float
) -> list[list[float | None]]:
    """Two consecutive samples (per device, a row of :data:`METRICS`) as one sample over both spans.

    Peak metrics take the max; the others are weighted by the time each sample stands for (for a CPU share, that
    is the share over both spans).
    """
    total = first_s + second_s
    rows = []
    for row_a, row_b in zip(first, second, strict=True):
        row: list[float | None] = []
        for metric, a, b in zip(METRICS, row_a, row_b, strict=True):
            if a is None or b is None:
                row.append(b if a is None else a)
            elif metric in PEAK_METRICS:
                row.append(max(a, b))
            else:
                row.append((a * first_s + b * second_s) / total if total > 0 else b)
        rows.append(row)
    return rows


def rounded(value: float | None) -> float | None:
    """A value of the series as it travels: 0.1 precision, whole numbers above a million (bytes)."""
    return value if value is None else round(value, 1) if value < 1e6 else int(value)
