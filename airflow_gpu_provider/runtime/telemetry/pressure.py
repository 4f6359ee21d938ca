"""How busy the host's CPUs were while the task ran: Linux PSI (``/proc/pressure/cpu``), else the load average.

A task whose CPUs sat idle may have been starved by other processes of its host rather than by its own input
pipeline. PSI says it directly: ``some total`` is the time (µs) in which at least one runnable task waited for a CPU,
so its growth over the try, divided by the try's wall time, is the share of the try during which the host's CPUs
were too few. Where PSI is absent (kernels before 4.20, ``psi=0``) the 1-minute load average per CPU stands in, a
coarser and slower figure: ``1 - CPUs / load`` estimates the share of runnable work that waited.

``/proc/pressure`` and ``/proc/loadavg`` are kernel-wide: a container or pod reads its host's figures there unless
something (LXCFS) mounts its own view over those files, which :func:`scope` tells from the mount table. The summary
says which file it read and whose view it was.
"""

from __future__ import annotations

import os
import time
from typing import Any

PSI_CPU = "/proc/pressure/cpu"
LOADAVG = "/proc/loadavg"
MOUNTINFO = "/proc/self/mountinfo"


def parse_psi(text: str) -> dict[str, dict[str, float]]:
    """A PSI file (``some avg10=1.50 avg60=0.80 avg300=0.10 total=123456``, and maybe a ``full`` line) by line kind.

    :raises ValueError: when no line has the PSI form
    """
    lines: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        kind, _, rest = line.strip().partition(" ")
        if kind not in ("some", "full"):
            continue
        values = dict(field.partition("=")[::2] for field in rest.split())
        try:
            lines[kind] = {name: float(values[name]) for name in ("avg10", "avg60", "avg300")}
            lines[kind]["total"] = float(int(values["total"]))
        except (KeyError, ValueError):
            raise ValueError(f"not a PSI line: {line[:80]!r}") from None
    if "some" not in lines:
        raise ValueError(f"not a PSI file: {text[:80]!r}")
    return lines


def parse_loadavg(text: str) -> tuple[float, float, float]:
    """``/proc/loadavg`` (``0.52 0.58 0.59 1/389 12345``): the 1, 5 and 15-minute load averages."""
    one, five, fifteen = (float(value) for value in text.split()[:3])
    return one, five, fifteen


def scope(path: str, mountinfo: str = MOUNTINFO) -> str:
    """``"host"``, or ``"container (FSTYPE)"`` when ``path`` itself is a mount point (LXCFS's per-container view)."""
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                fields = line.split()
                if len(fields) > 4 and fields[4] == path:
                    after = fields[fields.index("-") + 1] if "-" in fields else "?"
                    return f"container ({after})"
    except OSError:
        pass
    return "host"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


class HostPressure:
    """The host's CPU pressure over one task try: PSI totals at the start and the end, else load averages.

    :param psi: the PSI file to read; :param loadavg: the load average file (the fallback)
    """

    def __init__(self, psi: str = PSI_CPU, loadavg: str = LOADAVG) -> None:
        self.psi, self.loadavg = psi, loadavg
        self.cpus = os.cpu_count() or 1  # the host's: PSI and the load are the host's too
        self.started = time.monotonic()
        self.start_total: float | None = None
        self.peak_avg10: float | None = None
        self.loads: list[float] = []
        try:
            self.start_total = parse_psi(_read(psi) or "")["some"]["total"]
            self.source: str | None = psi
        except (ValueError, KeyError):
            self.source = loadavg if _read(loadavg) is not None else None
        self.scope = scope(self.source) if self.source else ""

    def sample(self) -> None:
        """One reading: PSI's 10-second average (for its peak), or the 1-minute load average."""
        if self.source == self.psi:
            try:
                avg10 = parse_psi(_read(self.psi) or "")["some"]["avg10"]
            except (ValueError, KeyError):
                return
            self.peak_avg10 = avg10 if self.peak_avg10 is None else max(self.peak_avg10, avg10)
        elif self.source == self.loadavg:
            try:
                self.loads.append(parse_loadavg(_read(self.loadavg) or "")[0])
            except ValueError:
                return

    def summary(self) -> dict[str, Any] | None:
        """The profile's ``host_cpu``: what was read, whose view, and the share of the try the CPUs were too few."""
        if self.source is None:
            return None
        figures: dict[str, Any] = {"source": self.source, "scope": self.scope, "cpus": self.cpus}
        if self.source == self.psi and self.start_total is not None:
            elapsed = time.monotonic() - self.started
            try:
                end = parse_psi(_read(self.psi) or "")["some"]["total"]
            except (ValueError, KeyError):
                return None
            share = (end - self.start_total) / 1e6 / elapsed if elapsed > 0 else 0.0
            figures.update(pressure_pct=round(min(100.0, max(0.0, 100 * share)), 1), peak_avg10=self.peak_avg10)
            return figures
        if not self.loads:
            self.sample()
        if not self.loads:
            return None
        waited = [max(0.0, 1 - self.cpus / load) if load > 0 else 0.0 for load in self.loads]
        figures.update(
            pressure_pct=round(100 * sum(waited) / len(waited), 1),
            load_per_cpu=round(sum(self.loads) / len(self.loads) / self.cpus, 2),
        )
        return figures
