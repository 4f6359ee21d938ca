"""The sampler of a task try (:class:`Profiler`): its GPUs through NVML, else its process tree's CPU and memory."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from ..protocol import PREFIX
from .nvml import Nvml
from .proctree import ProcessTree
from .stats import METRICS, Stats, merge, rounded

PROFILE_POINTS = 600  # the series that comes back has at most this many points, whatever the duration


class Profiler:
    """Samples the task's GPUs (NVML), or its process tree's CPU and memory, in a background thread.

    It never delays or breaks the task: a sampling error ends the sampling with one log line. The series is
    thinned as it grows (pairs of points merged), so memory and the result stay bounded whatever the duration.
    """

    def __init__(self, interval_s: float) -> None:
        import threading

        self.interval_s = max(0.05, float(interval_s))
        reason = "no GPU visible to the task"
        try:
            self.source: Any = Nvml()
        except (OSError, AttributeError) as exc:  # no driver here, or one without a symbol we call
            self.source, reason = None, str(exc)
        if self.source is None or not self.source.devices:
            if self.source is not None:
                self.source.close()
            self.source = ProcessTree()
            print(f"{PREFIX} profile: CPU profile of the task's processes (no GPU telemetry: {reason})", flush=True)
        self.kind = "cpu" if isinstance(self.source, ProcessTree) else "gpu"
        self.stats = [Stats() for _ in self.source.devices]
        self.points: list[list[float | None]] = []
        self.pending: list[list[float | None]] = []
        self.width = 1  # samples per point
        self.samples = 0
        self.started = time.time()
        self.clock = time.monotonic()
        self.last = self.clock
        self.energy = self.source.energy_joules()
        self.error: str | None = None
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._loop, name="gpu-profile", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        try:
            while True:
                self._sample()
                if self.stopping.wait(self.interval_s):
                    return
        except Exception as exc:  # noqa: BLE001 - the task goes on without its profile
            self.error = f"{type(exc).__name__}: {exc}"
            print(f"{PREFIX} profile: sampling stopped ({self.error})", flush=True)

    def _sample(self) -> None:
        with self.lock:  # the thread's samples, and stop()'s last one
            self._sample_locked()

    def _sample_locked(self) -> None:
        rows = self.source.sample()
        now = time.monotonic()
        seconds, self.last = now - self.last, now
        self.samples += 1
        for stats, row in zip(self.stats, rows, strict=False):
            stats.add(row, seconds)
        self.pending.append([round(now - self.clock, 3)] + [value for row in rows for value in row])
        if len(self.pending) == self.width:
            self.points.append(merge(self.pending))
            self.pending = []
        if len(self.points) >= 2 * PROFILE_POINTS:
            self.points = [merge(self.points[i : i + 2]) for i in range(0, len(self.points), 2)]
            self.width *= 2

    def stop(self) -> dict[str, Any]:
        """End the sampling (one last sample) and return the profile that travels with the result envelope."""
        self.stopping.set()
        self.thread.join(timeout=5)
        if not self.thread.is_alive() and self.error is None:
            with contextlib.suppress(Exception):  # the samples so far still make a profile
                self._sample()
        energy = self.source.energy_joules()
        self.source.close()
        points = self.points + ([merge(self.pending)] if self.pending else [])
        while len(points) > PROFILE_POINTS:
            points = [merge(points[i : i + 2]) for i in range(0, len(points), 2)]
        devices: list[dict[str, Any]] = []
        series: dict[str, Any] = {"t": [p[0] for p in points]}
        for position, ((info, _), stats) in enumerate(zip(self.source.devices, self.stats, strict=True)):
            start, end = self.energy[position], energy[position]
            joules = (
                end - start if start is not None and end is not None else stats.energy_j if stats.peak_power else None
            )
            devices.append({**info, **stats.summary(info.get("memory_total"), joules)})
            first = 1 + position * len(METRICS)
            columns = {metric: [rounded(p[first + i]) for p in points] for i, metric in enumerate(METRICS)}
            series[info["index"]] = {m: values for m, values in columns.items() if any(v is not None for v in values)}
        return {
            "version": 1,
            "kind": self.kind,
            "host": os.uname().nodename,
            "interval_s": self.interval_s,
            "started": self.started,
            "duration_s": round(time.monotonic() - self.clock, 3),
            "samples": self.samples,
            "devices": devices,
            "series": series,
            "error": self.error,
        }


def start_profiler(envelope: dict[str, Any]) -> Profiler | None:
    """The task's sampler, when the envelope asks for one; one per node (``LOCAL_RANK`` 0 under a launcher)."""
    settings = envelope.get("profile")
    if not settings or os.environ.get("LOCAL_RANK", "0") != "0":
        return None
    try:
        return Profiler(float(settings.get("interval_s", 1.0)))
    except Exception as exc:  # noqa: BLE001 - the task runs without its profile
        print(f"{PREFIX} profile: not sampled ({type(exc).__name__}: {exc})", flush=True)
        return None
