"""The profile of a task without GPUs: CPU % and memory of its process tree, from ``/proc`` and its cgroup."""

from __future__ import annotations

import os
import time

MIN_TICKS = 2  # the shortest span (in clock ticks, 10 ms each at 100 Hz) over which a CPU share is measured


class ProcessTree:
    """CPU % and RSS of this process and its descendants, from ``/proc``: the profile of a task without GPUs."""

    def __init__(self) -> None:
        self.root = os.getpid()
        self.cpus = cpu_limit()
        self.tick = os.sysconf("SC_CLK_TCK")
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.children_files = os.path.exists(f"/proc/{self.root}/task/{self.root}/children")
        self.last: tuple[float, float] | None = None
        self.devices = [
            (
                {"index": "cpu", "uuid": "", "name": f"CPU (task process tree, {self.cpus:g} cores)",
                 "memory_total": memory_limit()},
                None,
            )
        ]  # fmt: skip

    def _children(self, pid: int, parents: dict[int, list[int]] | None) -> list[int]:
        """``pid``'s children: from its threads' ``children`` files, else from a scan of every process's parent."""
        if parents is not None:
            return parents.get(pid, [])
        found: list[int] = []
        for thread in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{thread}/children", encoding="ascii") as handle:
                found.extend(int(child) for child in handle.read().split())
        return found

    @staticmethod
    def _parents() -> dict[int, list[int]]:
        """Children by parent, for kernels without ``/proc/PID/task/TID/children``."""
        parents: dict[int, list[int]] = {}
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                    parent = int(handle.read().rpartition(")")[2].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(parent, []).append(int(entry))
        return parents

    def _tree(self) -> tuple[float, int]:
        """CPU seconds (with those of its finished children) and resident bytes of the tree now."""
        parents = None if self.children_files else self._parents()
        cpu, rss, todo = 0.0, 0, [self.root]
        while todo:
            pid = todo.pop()
            try:
                with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
                    fields = handle.read().rpartition(")")[2].split()
                todo.extend(self._children(pid, parents))
            except OSError:
                continue  # it ended meanwhile
            cpu += sum(int(fields[i]) for i in (11, 12, 13, 14)) / self.tick  # utime stime cutime cstime
            rss += int(fields[21]) * self.page
        return cpu, rss

    def sample(self) -> list[list[float | None]]:
        """One row of :data:`~.stats.METRICS`: the tree's CPU % since the last sample (of the cores it may use), RSS.

        The CPU % is unknown (``None``) over less than :data:`MIN_TICKS` clock ticks, where the kernel's counters
        (whole ticks) say nothing; that span is counted in the next sample's.
        """
        now, (cpu, rss) = time.monotonic(), self._tree()
        util = None
        if self.last is not None and (now - self.last[0]) * self.tick < MIN_TICKS:
            return [[None, rss, None, None, None]]
        if self.last is not None:
            util = min(100.0, max(0.0, (cpu - self.last[1]) / (now - self.last[0]) / self.cpus * 100))
        self.last = (now, cpu)
        return [[util, rss, None, None, None]]

    def energy_joules(self) -> list[float | None]:
        """No energy counter for a CPU."""
        return [None]

    def close(self) -> None:
        """Nothing to release."""


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return None


def cpu_limit() -> float:
    """The CPUs this task may use: its cgroup's quota (cgroup v2, as in a container), else its affinity mask."""
    quota, _, period = (_read_text("/sys/fs/cgroup/cpu.max") or "max").partition(" ")
    if quota.isdigit() and period.isdigit() and int(period):
        return max(0.01, int(quota) / int(period))
    return float(len(os.sched_getaffinity(0)))


def memory_limit() -> int | None:
    """The memory this task may use: its cgroup's limit (cgroup v2), else the host's."""
    limit = _read_text("/sys/fs/cgroup/memory.max") or ""
    if limit.isdigit():
        return int(limit)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        return None
