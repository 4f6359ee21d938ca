"""The sampler of a task try (:class:`Profiler`): its GPUs through NVML, else its process tree's CPU and memory."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, NamedTuple

from ..failures import describe_fault
from ..output import say
from ..protocol import PREFIX, PROFILE_VERSION
from .nvml import Nvml, none_visible
from .pressure import HostPressure
from .proctree import ProcessTree
from .stats import METRICS, Stats, combine, merge, rounded

PROFILE_POINTS = 600  # the series that comes back has at most this many points, whatever the duration


class Sample(NamedTuple):
    """The latest sample, held back until the next one: the final one may be merged into it."""

    rows: list[list[float | None]]  # per device, a row of METRICS
    seconds: float  # the time it stands for: since the sample before it
    at: float  # seconds since the sampling started


class Profiler:
    """Samples the task's GPUs (NVML), or its process tree's CPU and memory, in a background thread.

    It never delays or breaks the task: a sampling error ends the sampling with one log line. The series is
    thinned as it grows (pairs of points merged), so memory and the result stay bounded whatever the duration.
    """

    def __init__(
        self, interval_s: float, *, host: str = "", cpu_fallback: str | None = None, share: Any = None
    ) -> None:
        """Start sampling.

        :param host: the worker's host name as Airflow knows it (the envelope's); empty: this machine's own name
        :param cpu_fallback: why the task runs on the CPU instead of its GPUs (``on_missing_gpu="cpu"``), or None
        :param share: the share of a GPU the task holds, as it is enforced (the summary's), or None
        """
        import threading

        self.interval_s = max(0.05, float(interval_s))
        self.node = os.uname().nodename  # the container's id on Docker, the pod's name on Kubernetes
        self.host = host or self.node
        self.cpu_fallback, self.share = cpu_fallback, share
        self.pressure = HostPressure()
        self.source: Any = None
        reason = "no GPU visible to the task"
        if not none_visible():
            try:
                self.source = Nvml()
            except (OSError, AttributeError) as exc:  # no driver here, or one without a symbol we call
                reason = str(exc)
        if self.source is None or not self.source.devices:
            if self.source is not None:
                self.source.close()
            self.source = ProcessTree()
            say(f"{PREFIX} profile: CPU profile of the task's processes (no GPU telemetry: {reason})")
        self.kind = "cpu" if isinstance(self.source, ProcessTree) else "gpu"
        self.stats = [Stats() for _ in self.source.devices]
        self.points: list[list[float | None]] = []
        self.pending: list[list[float | None]] = []
        self.width = 1  # samples per point
        self.samples = 0
        self.held: Sample | None = None
        self.started = time.time()
        self.clock = time.monotonic()
        self.last = self.clock
        self.energy = self.source.energy_joules()
        self.faults: list[dict[str, Any]] = []  # Xid events, uncorrectable ECC errors (Nvml.faults)
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
            say(f"{PREFIX} profile: sampling stopped ({self.error})")

    def _sample(self, *, final: bool = False) -> None:
        with self.lock:  # the thread's samples, and stop()'s last one
            self._sample_locked(final)

    def _sample_locked(self, final: bool) -> None:
        """Take a sample; settle the one before it.

        A final sample closer to it than the interval is merged into it (one sample over both spans): a
        sub-millisecond span reads nothing but the granularity of the kernel's counters.
        """
        rows = self.source.sample()
        self.pressure.sample()
        for fault in self.source.faults() if self.kind == "gpu" else []:
            fault["at"] = round(time.monotonic() - self.clock, 3)
            self.faults.append(fault)
            say(f"{PREFIX} profile: {describe_fault(fault)}")
        now = time.monotonic()
        seconds, self.last = now - self.last, now
        held = self.held
        if final and held is not None and seconds < self.interval_s:
            rows, seconds = combine(held.rows, held.seconds, rows, seconds), held.seconds + seconds
        else:
            self._settle()
        self.held = Sample(rows, seconds, round(now - self.clock, 3))

    def _settle(self) -> None:
        """Count the held sample in the statistics and the series."""
        if self.held is None:
            return
        rows, seconds, at = self.held
        self.held = None
        self.samples += 1
        for stats, row in zip(self.stats, rows, strict=False):
            stats.add(row, seconds)
        self.pending.append([at, *(value for row in rows for value in row)])
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
        if not self.thread.is_alive():  # (a thread stuck in a driver call keeps its held sample)
            if self.error is None:
                with contextlib.suppress(Exception):  # the samples so far still make a profile
                    self._sample(final=True)
            self._settle()
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
            "version": PROFILE_VERSION,
            "kind": self.kind,
            "host": self.host,
            "node": self.node,
            "interval_s": self.interval_s,
            "started": self.started,
            "duration_s": round(time.monotonic() - self.clock, 3),
            "samples": self.samples,
            "devices": devices,
            "series": series,
            "host_cpu": self.pressure.summary(),
            "cpu_fallback": self.cpu_fallback is not None,
            "cpu_fallback_reason": self.cpu_fallback,
            **({"share": self.share} if self.share else {}),
            "gpu_faults": self.faults,
            "error": self.error,
        }


def start_profiler(envelope: dict[str, Any]) -> Profiler | None:
    """The task's sampler, when the envelope asks for one; one per node (``LOCAL_RANK`` 0 under a launcher)."""
    settings = envelope.get("profile")
    if not settings or os.environ.get("LOCAL_RANK", "0") != "0":
        return None
    summary = envelope.get("summary") or {}
    fell_back = bool((summary.get("effective") or {}).get("cpu_fallback"))
    try:
        return Profiler(
            float(settings.get("interval_s", 1.0)),
            host=str(settings.get("host") or ""),
            cpu_fallback=str(summary.get("cpu_fallback_reason") or "no reason given") if fell_back else None,
            share=summary.get("share"),
        )
    except Exception as exc:  # noqa: BLE001 - the task runs without its profile
        say(f"{PREFIX} profile: not sampled ({type(exc).__name__}: {exc})")
        return None
