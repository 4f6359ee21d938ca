"""Runtime of a GPU task: runs inside the child process, container or pod. Standard library only.

It is shipped as this one file, so any image with ``python3`` can run it. It owns the wire protocol between a
backend and the task process (envelope version 2)::

    python3 bootstrap.py ENVELOPE RESULT               the task process
    python3 bootstrap.py ENVELOPE --rank-results DIR    one rank of a launch (started by this runtime itself)

``ENVELOPE`` is a JSON file path, or ``env:NAME`` for base64 JSON in an environment variable. ``RESULT`` is where
the result envelope goes: a file path, or ``-`` to print it as the last log line (``[gpu] result: {...}``) where no
file can travel back (a multi-node Kubernetes run). It is a command-line argument, not part of the envelope, so that
a runtime that cannot read its envelope still reports why. The envelope::

    {"version": 2, "mode": "callable", "function": "train", "source": "def train(...): ...",
     "filename": "/dags/demo.py", "first_line": 12, "args": [...], "kwargs": {...}, "clear_cache": true,
     "summary": {"backend": "local", "image": "...", "requirements_hash": "...", "resources": "...",
                 "gpus": [{"index": "0", "name": "...", "memory_total": 85899345920}] | null},
     "die_with_parent": false, "profile": {"interval_s": 1.0} | null, "resume": true,
     "launch": {"module": "accelerate.commands.launch", "args": ["--num_processes", "2", ...],
                "environment": {...}, "cpu_environment": {"ACCELERATE_USE_CPU": "1"},
                "rank_arguments": {"--machine_rank": "NODE_RANK"}, "free_port_argument": "--main_process_port"}}

    {"version": 2, "mode": "command", "command": ["python", "train.py"], "summary": {...}}

``summary`` (added by the backend) starts the log; ``gpus: null`` asks the driver; its ``effective`` resources
(after a CPU fallback) are exported to the task as ``AIRFLOW_GPU_RESOURCES`` (JSON). ``launch`` (optional) runs the
payload once per rank under a launcher: ``environment`` is added to the ranks' environment, ``cpu_environment``
too when the task has no GPU, ``rank_arguments`` take their values from the environment (a pod's node rank), and
``free_port_argument`` gets a free local port unless given. Each rank writes ``DIR/rank<RANK>.json``; the result is
rank 0's value, or the earliest error of any rank. A process that another launcher started as a rank other than 0
(``RANK``) reports nothing: rank 0 reports for the group.

The task's checkpoint folder comes in the environment (``AIRFLOW_GPU_CHECKPOINT_DIR``, set by the backend: a path
here, or a URI), not in the envelope; it is made when missing and named in the log. ``resume`` (optional) looks
for the newest ``accelerator.save_state`` folder there (:func:`newest_checkpoint`), exports it as
``AIRFLOW_GPU_RESUME_FROM`` / ``AIRFLOW_GPU_RESUME_STEP``, and loads it in each process that runs the function right
after its first ``Accelerator.prepare`` (:func:`resume_after_prepare`).

``profile`` (optional) starts a :class:`Profiler` for the try (one per node under a launcher): NVML through
``ctypes``, else a CPU profile from ``/proc``; a command then runs as this process's child instead of replacing it.

The result envelope: ``{"ok": true, "return_value": ..., "cache": [...]}`` or
``{"ok": false, "error": {"type": ..., "message": ..., "traceback": ...}}`` (a command's failure:
``{"ok": false, "exit_status": N}``), with ``"profile": {...}`` when the try was sampled. Exit status 0 on success,
1 when the user code raised, 2 when the envelope itself is unusable.

The same file installs a task's requirements (:func:`install_requirements`: the local backend's venvs, the
Kubernetes init container), and its CUDA helpers (:func:`clear_cuda_cache`, :func:`list_gpus`,
:func:`cuda_memory_stats`) are what ``CudaHook`` and the worker's GPU inventory call: one implementation of each.
"""

from __future__ import annotations
import __future__

import base64
import contextlib
import gc
import json
import linecache
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

ENVELOPE_VERSION = 2
PREFIX = "[gpu]"
EXIT_USER_ERROR = 1
EXIT_BAD_ENVELOPE = 2
RESULT_TO_LOG = "-"
RESULT_MARKER = f"{PREFIX} result: "
RANK_RESULTS = "--rank-results"
RESOURCES_ENV = "AIRFLOW_GPU_RESOURCES"  # the resources the task runs with, as JSON (the summary's "effective")
CHECKPOINT_ENV = "AIRFLOW_GPU_CHECKPOINT_DIR"  # the task's checkpoint folder (set by the backend): a path or a URI
RESUME_FROM_ENV = "AIRFLOW_GPU_RESUME_FROM"  # with "resume": the newest checkpoint found there, loaded after prepare()
RESUME_STEP_ENV = "AIRFLOW_GPU_RESUME_STEP"  # and the number in its folder's name (checkpoint_2 -> 2)
CHECKPOINT_URI_ENV = "AIRFLOW_GPU_CHECKPOINT_URI"  # with "resume" and a URI folder: the URI, staged locally


# --------------------------------------------------------------------------------------------- CUDA helpers
def _loaded_torch(import_torch: bool) -> Any:
    """Return the torch module if it is loaded (or may be imported), else None. Never imports it otherwise."""
    if "torch" in sys.modules:
        return sys.modules["torch"]
    if not import_torch:
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch


def _reserved_bytes(torch: Any) -> int:
    return sum(torch.cuda.memory_reserved(i) for i in range(torch.cuda.device_count()))


def clear_cuda_cache(import_torch: bool = False) -> dict[str, Any]:
    """Free cached GPU memory: ``gc.collect()`` until nothing is left, then ``empty_cache`` and ``ipc_collect``.

    As ZenML's ``cleanup_memory``, but reports what it did. torch is used only if it is already loaded in this
    process (or ``import_torch`` is true): a process that never loaded torch holds no CUDA cache.

    :return: ``{"status": "cleared"|"skipped", "reason": str, "freed_bytes": int, "gc_rounds": int}``
    """
    rounds = 0
    while rounds < 10:
        rounds += 1
        if gc.collect() == 0:
            break
    torch = _loaded_torch(import_torch)
    if torch is None:
        return {"status": "skipped", "reason": "torch is not loaded", "freed_bytes": 0, "gc_rounds": rounds}
    if not torch.cuda.is_available():
        return {"status": "skipped", "reason": "CUDA is not available", "freed_bytes": 0, "gc_rounds": rounds}
    if not torch.cuda.is_initialized():
        return {
            "status": "skipped",
            "reason": "CUDA was never initialised in this process",
            "freed_bytes": 0,
            "gc_rounds": rounds,
        }
    before = _reserved_bytes(torch)
    torch.cuda.empty_cache()
    torch.cuda.ipc_collect()
    freed = max(0, before - _reserved_bytes(torch))
    return {"status": "cleared", "reason": "", "freed_bytes": freed, "gc_rounds": rounds}


def cuda_memory_stats() -> list[dict[str, Any]]:
    """Per-device memory of this process (torch, if loaded and CUDA initialised), else of the device (NVML)."""
    torch = _loaded_torch(False)
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return [
            {
                "index": str(i),
                "name": torch.cuda.get_device_name(i),
                "allocated": torch.cuda.memory_allocated(i),
                "reserved": torch.cuda.memory_reserved(i),
                "total": torch.cuda.get_device_properties(i).total_memory,
            }
            for i in range(torch.cuda.device_count())
        ]
    return [
        {"index": g["index"], "name": g["name"], "used": g.get("memory_used"), "total": g["memory_total"]}
        for g in list_gpus()
    ]


def _nvml_gpus() -> list[dict[str, Any]] | None:
    try:
        import pynvml  # from nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                {
                    "index": str(i),
                    "uuid": pynvml.nvmlDeviceGetUUID(handle),
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "memory_total": int(memory.total),
                    "memory_used": int(memory.used),
                }
            )
        return gpus
    finally:
        pynvml.nvmlShutdown()


def _nvidia_smi_gpus() -> list[dict[str, Any]] | None:
    import shutil  # here, not at the top: every task start (and every container start) pays for top-level imports
    import subprocess

    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    query = "--query-gpu=index,uuid,name,memory.total,memory.used"
    try:
        out = subprocess.run(
            [binary, query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = []
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 5:
            index, uuid, name, total, used = fields
            gpus.append(
                {
                    "index": index,
                    "uuid": uuid,
                    "name": name,
                    "memory_total": int(float(total)) * 2**20,
                    "memory_used": int(float(used)) * 2**20,
                }
            )
    return gpus


def list_gpus() -> list[dict[str, Any]]:
    """NVIDIA GPUs visible to this process: NVML (nvidia-ml-py) if importable, else ``nvidia-smi``, else none."""
    for probe in (_nvml_gpus, _nvidia_smi_gpus):
        gpus = probe()
        if gpus is not None:
            return gpus
    return []


# --------------------------------------------------------------------------------------------- summary
def _format_bytes(amount: float | None) -> str:
    if amount is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if amount < 1024:
            return f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{amount:.1f} TiB"


def _describe_cache(result: dict[str, Any]) -> str:
    if result["status"] == "cleared":
        return f"cleared, {_format_bytes(result['freed_bytes'])} freed"
    return f"skipped ({result['reason']})"


def print_summary(summary: dict[str, Any], cache: dict[str, Any]) -> None:
    """Print the resource summary that starts every GPU task's log."""
    gpus = summary.get("gpus")
    if gpus is None:  # containers and pods: ask the device itself
        gpus = list_gpus()
    if gpus:
        gpu_text = "; ".join(f"{g['index']}: {g['name']} ({_format_bytes(g.get('memory_total'))})" for g in gpus)
    else:
        gpu_text = "none (running on CPU)"
    lines = [
        f"backend={summary.get('backend')} image={summary.get('image')} "
        f"requirements={summary.get('requirements_hash')}",
        f"resources: {summary.get('resources')}",
        f"GPUs assigned: {gpu_text}",
        f"CUDA cache before task: {_describe_cache(cache)}",
    ]
    for line in lines:
        print(f"{PREFIX} {line}", flush=True)


# --------------------------------------------------------------------------------------------- profile
PROFILE_POINTS = 600  # the series that comes back has at most this many points, whatever the duration
IDLE_UTILISATION = 10.0  # below this (%), a GPU counts as idle
NVML_LIBRARY = "libnvidia-ml.so.1"  # mounted into GPU containers by the NVIDIA container toolkit
METRICS = ("util", "memory_used", "power_w", "temperature_c", "sm_clock_mhz")
_PEAK_METRICS = frozenset({"memory_used", "temperature_c"})  # merged by max when the series is thinned; others mean
_NO_DEVICES = ("", "-1", "none", "void", "nodevfiles")


class _Nvml:
    """The task's visible GPUs through NVML, called with ``ctypes`` (no nvidia-ml-py in the image).

    Visible means ``CUDA_VISIBLE_DEVICES`` (UUIDs or indices, as CUDA reads it), or every device NVML shows (in a
    container, the ones it was given).
    """

    def __init__(self) -> None:
        import ctypes

        class Utilization(ctypes.Structure):
            _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]

        class Memory(ctypes.Structure):
            _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

        self.ctypes, self.utilization, self.memory = ctypes, Utilization, Memory
        self.lib = ctypes.CDLL(NVML_LIBRARY)
        self.lib.nvmlErrorString.restype = ctypes.c_char_p
        self._call("nvmlInit_v2")
        try:
            self.devices = self._visible()
        except BaseException:
            self.close()
            raise

    def _call(self, name: str, *args: Any) -> None:
        status = getattr(self.lib, name)(*args)
        if status != 0:
            raise OSError(f"{name}: {self.lib.nvmlErrorString(status).decode(errors='replace')} ({status})")

    def _read(self, name: str, handle: Any, *args: Any) -> int | None:
        """One ``unsigned int`` metric, or ``None`` where the device does not report it (a MIG slice's power)."""
        value = self.ctypes.c_uint()
        status = getattr(self.lib, name)(handle, *args, self.ctypes.byref(value))
        return int(value.value) if status == 0 else None

    def _visible(self) -> list[tuple[dict[str, Any], Any]]:
        c = self.ctypes
        wanted = os.environ.get("CUDA_VISIBLE_DEVICES")
        if wanted is None:
            count = c.c_uint()
            self._call("nvmlDeviceGetCount_v2", c.byref(count))
            ids = [str(i) for i in range(count.value)]
        elif wanted.strip().lower() in _NO_DEVICES:
            ids = []
        else:
            ids = [part.strip() for part in wanted.split(",")]
        devices = []
        for position, device_id in enumerate(ids):
            handle = c.c_void_p()
            if device_id.isdigit():
                status = self.lib.nvmlDeviceGetHandleByIndex_v2(c.c_uint(int(device_id)), c.byref(handle))
            else:
                status = self.lib.nvmlDeviceGetHandleByUUID(device_id.encode(), c.byref(handle))
            if status != 0:
                break  # as CUDA: the devices before the first id that names none
            text = c.create_string_buffer(96)
            name = text.value.decode() if self.lib.nvmlDeviceGetName(handle, text, 96) == 0 else "?"
            uuid = text.value.decode() if self.lib.nvmlDeviceGetUUID(handle, text, 96) == 0 else device_id
            index = self._read("nvmlDeviceGetIndex", handle)
            memory = self.memory()
            total = memory.total if self.lib.nvmlDeviceGetMemoryInfo(handle, c.byref(memory)) == 0 else None
            info = {"index": str(position if index is None else index), "uuid": uuid, "name": name}
            devices.append(({**info, "memory_total": total}, handle))
        return devices

    def sample(self) -> list[list[float | None]]:
        """Per device, the :data:`METRICS` now (utilisation first: it is the sampling period's)."""
        c, rows = self.ctypes, []
        for _, handle in self.devices:
            utilization, memory = self.utilization(), self.memory()
            util = (
                utilization.gpu if self.lib.nvmlDeviceGetUtilizationRates(handle, c.byref(utilization)) == 0 else None
            )
            used = memory.used if self.lib.nvmlDeviceGetMemoryInfo(handle, c.byref(memory)) == 0 else None
            power = self._read("nvmlDeviceGetPowerUsage", handle)
            temperature = self._read("nvmlDeviceGetTemperature", handle, c.c_int(0))  # NVML_TEMPERATURE_GPU
            clock = self._read("nvmlDeviceGetClockInfo", handle, c.c_int(1))  # NVML_CLOCK_SM
            rows.append([util, used, None if power is None else power / 1000, temperature, clock])
        return rows

    def energy_joules(self) -> list[float | None]:
        """Per device, the energy counter (J since the driver loaded; ``None`` before Volta)."""
        value, energies = self.ctypes.c_ulonglong(), []
        for _, handle in self.devices:
            ok = self.lib.nvmlDeviceGetTotalEnergyConsumption(handle, self.ctypes.byref(value)) == 0
            energies.append(value.value / 1000 if ok else None)
        return energies

    def close(self) -> None:
        self.lib.nvmlShutdown()


class _ProcessTree:
    """CPU % and RSS of this process and its descendants, from ``/proc``: the profile of a task without GPUs."""

    def __init__(self) -> None:
        self.root = os.getpid()
        self.cpus = _cpu_limit()
        self.tick = os.sysconf("SC_CLK_TCK")
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.children_files = os.path.exists(f"/proc/{self.root}/task/{self.root}/children")
        self.last: tuple[float, float] | None = None
        self.devices = [
            (
                {"index": "cpu", "uuid": "", "name": f"CPU (task process tree, {self.cpus:g} cores)",
                 "memory_total": _memory_limit()},
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
        now, (cpu, rss) = time.monotonic(), self._tree()
        util = None
        if self.last is not None and now > self.last[0]:
            util = min(100.0, max(0.0, (cpu - self.last[1]) / (now - self.last[0]) / self.cpus * 100))
        self.last = (now, cpu)
        return [[util, rss, None, None, None]]

    def energy_joules(self) -> list[float | None]:
        return [None]

    def close(self) -> None:
        pass


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return None


def _cpu_limit() -> float:
    """The CPUs this task may use: its cgroup's quota (cgroup v2, as in a container), else its affinity mask."""
    quota, _, period = (_read_text("/sys/fs/cgroup/cpu.max") or "max").partition(" ")
    if quota.isdigit() and period.isdigit() and int(period):
        return max(0.01, int(quota) / int(period))
    return float(len(os.sched_getaffinity(0)))


def _memory_limit() -> int | None:
    """The memory this task may use: its cgroup's limit (cgroup v2), else the host's."""
    limit = _read_text("/sys/fs/cgroup/memory.max") or ""
    if limit.isdigit():
        return int(limit)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        return None


class _Stats:
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
        util, used, power, temperature, _ = row
        if util is not None:
            self.count += 1
            self.total += util
            self.histogram[min(100, max(0, round(util)))] += 1
            if util < IDLE_UTILISATION:
                self.idle_s += seconds
        self.peak_memory = _max(self.peak_memory, used)
        self.peak_power = _max(self.peak_power, power)
        self.max_temperature = _max(self.max_temperature, temperature)
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
        if not self.count:
            return None
        rank, seen = fraction * self.count, 0
        for value, hits in enumerate(self.histogram):
            seen += hits
            if seen >= rank:
                return float(value)
        return 100.0


def _max(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else max(a, b)


def _merge(points: list[list[float | None]]) -> list[float | None]:
    """One point for several: the first time, the max of peak metrics, the mean of the others."""
    merged: list[float | None] = [points[0][0]]
    for column in range(1, len(points[0])):
        values = [p[column] for p in points if p[column] is not None]
        if not values:
            merged.append(None)
        elif METRICS[(column - 1) % len(METRICS)] in _PEAK_METRICS:
            merged.append(max(values))  # type: ignore[type-var]
        else:
            merged.append(sum(values) / len(values))  # type: ignore[arg-type]
    return merged


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
            self.source: Any = _Nvml()
        except (OSError, AttributeError) as exc:  # no driver here, or one without a symbol we call
            self.source, reason = None, str(exc)
        if self.source is None or not self.source.devices:
            if self.source is not None:
                self.source.close()
            self.source = _ProcessTree()
            print(f"{PREFIX} profile: CPU profile of the task's processes (no GPU telemetry: {reason})", flush=True)
        self.kind = "cpu" if isinstance(self.source, _ProcessTree) else "gpu"
        self.stats = [_Stats() for _ in self.source.devices]
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
            self.points.append(_merge(self.pending))
            self.pending = []
        if len(self.points) >= 2 * PROFILE_POINTS:
            self.points = [_merge(self.points[i : i + 2]) for i in range(0, len(self.points), 2)]
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
        points = self.points + ([_merge(self.pending)] if self.pending else [])
        while len(points) > PROFILE_POINTS:
            points = [_merge(points[i : i + 2]) for i in range(0, len(points), 2)]
        devices: list[dict[str, Any]] = []
        series: dict[str, Any] = {"t": [p[0] for p in points]}
        for position, ((info, _), stats) in enumerate(zip(self.source.devices, self.stats, strict=True)):
            start, end = self.energy[position], energy[position]
            joules = (
                end - start if start is not None and end is not None else stats.energy_j if stats.peak_power else None
            )
            devices.append({**info, **stats.summary(info.get("memory_total"), joules)})
            first = 1 + position * len(METRICS)
            columns = {metric: [_round(p[first + i]) for p in points] for i, metric in enumerate(METRICS)}
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


def _round(value: float | None) -> float | None:
    return value if value is None else round(value, 1) if value < 1e6 else int(value)


# --------------------------------------------------------------------------------------------- the protocol
def load_envelope(source: str) -> dict[str, Any]:
    """Read an envelope from a file or from ``env:NAME``; raise for one this runtime cannot read."""
    if source.startswith("env:"):
        raw = base64.b64decode(os.environ[source[4:]]).decode()
    else:
        with open(source, encoding="utf-8") as handle:
            raw = handle.read()
    envelope = json.loads(raw)
    if envelope.get("version") != ENVELOPE_VERSION:
        raise ValueError(f"envelope version {envelope.get('version')!r}, this runtime reads {ENVELOPE_VERSION}")
    return envelope


def write_result(result_to: str, result: dict[str, Any]) -> None:
    """Report the result envelope: to a file (atomically), or as the last log line (``-``)."""
    if result_to == RESULT_TO_LOG:
        print(RESULT_MARKER + json.dumps(result), flush=True)
        return
    directory = os.path.dirname(os.path.abspath(result_to))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{result_to}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    os.replace(tmp, result_to)


def _rank_result_path(rank_results: str) -> str:
    return os.path.join(rank_results, f"rank{os.environ.get('RANK', '0')}.json")


# What accelerator libraries raise when the device's memory runs out: torch's OutOfMemoryError (torch.cuda's too),
# or the error text of CUDA, ROCm/HIP, XPU, cuBLAS and XLA. Python's own MemoryError is the host's memory, not this.
GPU_OOM_TYPES = ("OutOfMemoryError",)
GPU_OOM_TEXTS = (
    "CUDA out of memory",
    "CUDA error: out of memory",
    "HIP out of memory",
    "XPU out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "RESOURCE_EXHAUSTED: Out of memory",
)
GPU_OOM = "gpu_oom"


def is_gpu_oom(exc: BaseException | None) -> bool:
    """Whether ``exc``, or an exception it was raised from, says the GPU's memory ran out."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc).__name__ in GPU_OOM_TYPES or any(text in str(exc) for text in GPU_OOM_TEXTS):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _error(exc: BaseException) -> dict[str, Any]:
    return {
        "time": time.time(),  # the earliest error of several ranks is the root cause
        "type": type(exc).__name__,
        "kind": GPU_OOM if is_gpu_oom(exc) else "error",
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }


# --------------------------------------------------------------------------------------------- the payload
def _load_function(envelope: dict[str, Any]) -> Any:
    """Compile the shipped source so that tracebacks show the DAG file's own line numbers."""
    filename = envelope.get("filename") or "<gpu task>"
    padded = "\n" * (int(envelope.get("first_line", 1)) - 1) + envelope["source"]
    linecache.cache[filename] = (len(padded), None, padded.splitlines(True), filename)
    code = compile(padded, filename, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
    namespace: dict[str, Any] = {"__name__": "__gpu_task__", "__file__": filename}
    exec(code, namespace)  # noqa: S102 - running the task's own function is the point
    return namespace[envelope["function"]]


def _run_command(envelope: dict[str, Any], profiler: Profiler | None) -> tuple[dict[str, Any], int]:
    """Run the command (no shell): this process becomes it, or, while a sampler runs here, it runs as a child.

    :return: the result envelope and the exit status (the command's; 127 when it cannot start)
    """
    command = [str(part) for part in envelope["command"]]
    sys.stdout.flush()
    try:
        if profiler is None:
            os.execvp(command[0], command)  # noqa: S606 - an argument list, no shell; does not return
        status = _child(command)
    except OSError as exc:
        print(f"{PREFIX} cannot run {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        return {"ok": False, "error": _error(exc)}, 127
    return _command_result(status), status


def _command_result(status: int) -> dict[str, Any]:
    """A command's result envelope: its exit status decides (``result_value`` words the failure)."""
    return {"ok": True, "return_value": None} if status == 0 else {"ok": False, "exit_status": status}


def _child(argv: list[str], environ: dict[str, str] | None = None) -> int:
    """Run ``argv`` to its end, passing SIGTERM and SIGINT on (``docker stop`` reaches PID 1, ``on_kill`` the group).

    :return: its exit status; 128 + N when signal N ended it, as a shell reports it
    """
    import signal
    import subprocess

    process = subprocess.Popen(argv, env=environ)  # the task's own command, no shell
    forward = {
        sig: signal.signal(sig, lambda number, _: process.send_signal(number))
        for sig in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        status = process.wait()
    finally:
        for sig, previous in forward.items():
            signal.signal(sig, previous)
    return 128 - status if status < 0 else status


def _call_function(envelope: dict[str, Any]) -> dict[str, Any]:
    """Call the shipped function; return the result envelope (without the cache report). Never raises."""
    started = time.monotonic()
    try:
        function = _load_function(envelope)
        value = function(*envelope.get("args", []), **envelope.get("kwargs", {}))
        try:
            json.dumps(value, allow_nan=False)  # NaN and infinity are not JSON: XCom would refuse them later
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"the return value of {envelope['function']}() is a {type(value).__name__}, which cannot travel "
                f"back as JSON ({exc}); return None, bool, int, float (finite), str, or lists/dicts of those"
            ) from exc
    except _Terminated:
        raise
    except SystemExit as exc:  # sys.exit() in user code: 0/None is success
        if exc.code not in (0, None):
            return _failed(exc)
        value = None
    except Exception as exc:  # noqa: BLE001 - everything the user code raises is reported
        return _failed(exc)
    return {"ok": True, "return_value": value, "duration_s": time.monotonic() - started}


def _failed(exc: BaseException) -> dict[str, Any]:
    traceback.print_exc()
    error = _error(exc)
    if error["kind"] == GPU_OOM:
        rank = f"rank {os.environ['RANK']}: " if "RANK" in os.environ else ""
        print(f"{PREFIX} {rank}the task ran out of GPU memory ({error['type']})", file=sys.stderr)
    sys.stderr.flush()
    return {"ok": False, "error": error}


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when the worker that started it dies (best effort)."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


# --------------------------------------------------------------------------------------------- launchers
def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def launch_command(envelope: dict[str, Any], source: str, rank_results: str, environ: dict[str, str]) -> list[str]:
    """The launcher's argv, e.g. ``python -m accelerate.commands.launch <args> bootstrap.py ENVELOPE ...``.

    :param source: the envelope's source (every rank reads it again)
    :param rank_results: the folder the ranks write their results to
    :param environ: the ranks' environment (``rank_arguments`` read it)
    """
    launch = envelope["launch"]
    argv = [sys.executable, "-m", launch["module"], *[str(a) for a in launch["args"]]]
    for flag, variable in (launch.get("rank_arguments") or {}).items():
        argv += [flag, environ[variable]]
    port_flag = launch.get("free_port_argument")
    if port_flag and port_flag not in argv:
        argv += [port_flag, str(_free_port())]
    if envelope["mode"] == "callable":
        return [*argv, os.path.abspath(__file__), source, RANK_RESULTS, rank_results]
    return [*argv, *[str(part) for part in envelope["command"]]]


def _has_gpus(envelope: dict[str, Any]) -> bool:
    gpus = (envelope.get("summary") or {}).get("gpus")
    return bool(gpus) if gpus is not None else bool(list_gpus())


def _run_launcher(envelope: dict[str, Any], source: str, result_to: str, profiler: Profiler | None) -> int:
    """Run the payload under the envelope's launcher; rank 0's result, or the earliest error of any rank, wins."""
    import tempfile

    launch = envelope["launch"]
    environ = {**os.environ, **(launch.get("environment") or {})}
    no_gpu = launch.get("cpu_environment") or {}
    if no_gpu and not _has_gpus(envelope):
        environ.update(no_gpu)
    on_cpu = bool(no_gpu) and all(environ.get(name) == value for name, value in no_gpu.items())
    with tempfile.TemporaryDirectory(prefix="airflow-gpu-ranks-") as rank_results:
        argv = launch_command(envelope, source, rank_results, environ)
        cpu_note = f" (CPU: {' '.join(f'{k}={v}' for k, v in no_gpu.items())})" if on_cpu else ""
        print(f"{PREFIX} launching{cpu_note}: {' '.join(argv)}", flush=True)
        status = _child(argv, environ)
        profile = None if profiler is None else profiler.stop()
        if envelope["mode"] != "callable":
            if profile is not None:
                write_result(result_to, {**_command_result(status), "profile": profile})
            return status
        results = {}
        for name in os.listdir(rank_results):
            if name.startswith("rank") and name.endswith(".json") and name[4:-5].isdigit():
                with open(os.path.join(rank_results, name), encoding="utf-8") as handle:
                    results[int(name[4:-5])] = json.load(handle)
    result, status = _merge_ranks(results, status, launch["module"])
    if profile is not None:
        result["profile"] = profile
    write_result(result_to, result)
    return status


def _merge_ranks(results: dict[int, dict[str, Any]], status: int, launcher: str) -> tuple[dict[str, Any], int]:
    """One result for the launch: the earliest error of any rank, else rank 0's value."""
    errors = sorted((r["error"].get("time", 0), rank) for rank, r in results.items() if not r.get("ok"))
    if errors:
        rank = errors[0][1]
        failed = results[rank]
        failed["error"]["message"] = f"rank {rank}: {failed['error']['message']}"
        return failed, EXIT_USER_ERROR
    if status == 0:  # rank 0's value; on the other machines of a multi-node run, rank 0 is elsewhere
        return {**results.get(0, {"ok": True, "return_value": None}), "ranks": len(results)}, 0
    message = (
        f"{launcher} exited with status {status} and no rank reported an exception "
        "(a rank was killed, or the launcher itself failed): see the log above"
    )
    return {"ok": False, "error": {"type": "LaunchError", "message": message, "traceback": ""}}, status or 1


# --------------------------------------------------------------------------------------------- requirements
class InstallError(RuntimeError):
    """An installer command failed; the message ends with its last lines of output."""


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it replaced: ``https://***@host/...``."""
    import re

    return re.sub(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@", r"\g<scheme>***@", text)


def uv_ca_variable(uv_version: str) -> str:
    """The variable that makes this uv trust the system CA store, as pip does (renamed in uv 0.11)."""
    import re

    numbers = tuple(int(part) for part in re.findall(r"\d+", uv_version)[:2])
    return "UV_SYSTEM_CERTS" if numbers >= (0, 11) else "UV_NATIVE_TLS"


def _installer(argv: list[str], emit: Callable[[str], None], environ: dict[str, str] | None = None) -> str:
    """Run one installer command, each line of its output to ``emit``; raise with the tail on failure."""
    import subprocess

    emit(redact(f"$ {' '.join(argv)}"))
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environ or dict(os.environ)
    )
    assert process.stdout is not None
    lines = []
    try:
        for line in process.stdout:
            lines.append(redact(line.rstrip()))
            emit(f"  {lines[-1]}")
    finally:
        if process.poll() is None:
            process.kill()
        status = process.wait()
    if status != 0:
        tail = "\n".join(lines[-20:])
        raise InstallError(f"{argv[0]} {' '.join(argv[1:3])} failed with exit status {status}:\n{tail}")
    return "\n".join(lines)


def _uv_from_pip(emit: Callable[[str], None]) -> str:
    """The uv binary for an image that has none: pip-installed into a temporary folder."""
    target = os.path.join(os.environ.get("TMPDIR", "/tmp"), "airflow-gpu-uv")
    _installer([sys.executable, "-m", "pip", "install", "--quiet", "--target", target, "uv"], emit)
    return os.path.join(target, "bin", "uv")


def split_credentials(index_args: list[str]) -> tuple[list[str], str]:
    """Index arguments with the credentials taken out of their URLs, and those credentials as netrc lines.

    Installers get the credentials from the netrc file (``NETRC``, read by uv and pip alike): never on a command
    line, which every user of the host can read in ``/proc``, nor in a log.
    """
    from urllib.parse import unquote, urlsplit, urlunsplit

    clean, lines = [], []
    for arg in index_args:
        parts = urlsplit(arg) if "://" in arg else None
        if parts is None or parts.username is None:
            clean.append(arg)
            continue
        host = parts.hostname or ""
        clean.append(urlunsplit(parts._replace(netloc=host + (f":{parts.port}" if parts.port else ""))))
        login, password = unquote(parts.username), unquote(parts.password or "")
        if any(c.isspace() for c in login + password):
            raise InstallError(f"credentials for {host} with white space cannot be passed in a netrc file")
        lines.append(f"machine {host} login {login} password {password or chr(34) * 2}")  # a token alone: ""
    return clean, "".join(f"{line}\n" for line in lines)


def install_requirements(
    requirements: list[str],
    index_args: list[str],
    *,
    installer: str,
    python: str,
    target: str | None = None,
    resolve_with: str | None = None,
    uv: str | None = None,
    emit: Callable[[str], None] = print,
    where: str = "the environment",
) -> None:
    """Install ``requirements`` for ``python`` (into ``target`` with ``--target``, else into its environment).

    uv installs only what is missing: ``uv pip install --dry-run`` against ``resolve_with`` (default ``python``)
    lists the missing packages as exact pins, and those alone are installed with ``--no-deps``, so a requirement
    like ``accelerate`` never brings a second torch next to the one already there. pip installs what ``python``
    does not see yet. Credentials in index URLs go to a private netrc file for the installers' time only.

    :param uv: the uv binary (default: ``uv`` on the PATH, else pip-installed first)
    :param emit: receives each line of the installers' output
    :param where: what ``resolve_with`` is, for the log ("the image", "the worker environment")
    :raises InstallError: when an installer fails
    """
    import shutil
    import tempfile

    index_args, netrc = split_credentials(index_args)
    environ = {**os.environ}
    secrets = tempfile.mkdtemp(prefix="airflow-gpu-netrc-") if netrc else None  # 0700
    try:
        if secrets is not None:
            environ["NETRC"] = os.path.join(secrets, "netrc")
            descriptor = os.open(environ["NETRC"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as handle:
                handle.write(netrc)
        into = ["--target", target] if target else []
        if installer == "pip":
            pip = [python, "-m", "pip", "install", "--disable-pip-version-check", *into, *index_args, *requirements]
            _installer(pip, emit, environ)
            return
        uv = uv or shutil.which("uv") or _uv_from_pip(emit)
        environ.setdefault(uv_ca_variable(_installer([uv, "--version"], lambda _: None)), "1")  # system CA store
        resolve = [uv, "pip", "install", "--dry-run", "--break-system-packages", "--python", resolve_with or python]
        plan = _installer([*resolve, *index_args, *requirements], emit, environ)
        pins = [line.strip()[2:].strip() for line in plan.splitlines() if line.strip().startswith("+ ")]
        if not pins:
            emit(f"{where} already satisfies every requirement")
            return
        _installer([uv, "pip", "install", "--no-deps", "--python", python, *into, *index_args, *pins], emit, environ)
    finally:
        if secrets is not None:
            shutil.rmtree(secrets, ignore_errors=True)


def install_main(argv: list[str]) -> int:
    """``TARGET INSTALLER [INDEX ARGS...] -- REQUIREMENTS...``: install into TARGET for this Python.

    What the Kubernetes init container runs.
    """
    target, installer, rest = argv[0], argv[1], argv[2:]
    index_args, requirements = rest[: rest.index("--")], rest[rest.index("--") + 1 :]
    try:
        install_requirements(
            requirements, index_args, installer=installer, python=sys.executable, target=target, where="the image",
            emit=lambda line: print(f"{PREFIX} {line}", flush=True),
        )  # fmt: skip
    except InstallError as exc:
        print(f"{PREFIX} {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


# --------------------------------------------------------------------------------------------- checkpoints
CHECKPOINT_MARKER = "random_states_0.pkl"  # the last file accelerator.save_state writes (process 0's RNG states)


def newest_checkpoint(folder: str) -> tuple[str, int | None] | None:
    """The newest complete ``accelerator.save_state`` folder in ``folder`` or its ``checkpoints/``, and its number.

    Newest as Accelerate's own ``load_state`` picks it: the highest first number in the folder's name
    (``checkpoint_12``, ``epoch_3``), then the latest written; a folder without :data:`CHECKPOINT_MARKER` was cut off
    while being saved and is skipped.
    """
    import re

    found = []
    for parent in (folder, os.path.join(folder, "checkpoints")):
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            path = os.path.join(parent, name)
            if os.path.isfile(os.path.join(path, CHECKPOINT_MARKER)):
                numbers = re.findall(r"[0-9]+", name)
                found.append((int(numbers[0]) if numbers else -1, os.path.getmtime(path), path))
    if not found:
        return None
    number, _, path = max(found)
    return path, None if number < 0 else number


def prepare_checkpoint(envelope: dict[str, Any]) -> None:
    """Announce the task's checkpoint folder (made if missing); with ``resume``, find what to resume from.

    The newest checkpoint goes to ``AIRFLOW_GPU_RESUME_FROM`` and its number to ``AIRFLOW_GPU_RESUME_STEP``,
    for the function, a script and every rank of a launch.
    """
    for name in (RESUME_FROM_ENV, RESUME_STEP_ENV):
        os.environ.pop(name, None)  # only this try's own lookup counts
    folder = os.environ.get(CHECKPOINT_ENV)
    if not folder:
        if envelope.get("resume"):
            print(f"{PREFIX} resume: the task has no checkpoint folder, so it starts afresh", flush=True)
        return
    if "://" not in folder:
        os.makedirs(folder, exist_ok=True)
    print(f"{PREFIX} checkpoint folder ({CHECKPOINT_ENV}): {folder}", flush=True)
    if not envelope.get("resume"):
        return
    if "://" in folder:
        try:
            folder = stage_from_uri(folder)
        except Exception as exc:  # noqa: BLE001 - no fsspec, no credentials: the task starts afresh, and says why
            print(f"{PREFIX} resume: cannot read {folder} ({type(exc).__name__}: {exc}); fsspec and the store's "
                  "credentials must be in the task's environment. Starting afresh", flush=True)  # fmt: skip
            return
    found = newest_checkpoint(folder)
    if found is None:
        print(f"{PREFIX} resume: no checkpoint in {folder} yet, so the task starts afresh", flush=True)
        return
    path, number = found
    os.environ[RESUME_FROM_ENV] = path
    if number is not None:
        os.environ[RESUME_STEP_ENV] = str(number)
    print(f"{PREFIX} resume: from {path} (step {number}), loaded after the first accelerator.prepare()", flush=True)


class _Terminated(SystemExit):
    """SIGTERM, raised in the function by :func:`_exit_on_sigterm`."""


def _exit_on_sigterm() -> None:
    """SIGTERM raises :class:`_Terminated` in the function: its ``finally`` blocks run (a last checkpoint).

    Also as PID 1 of a container, which the kernel spares the signals it does not handle. A handler of the
    function's own replaces this one. Once the function has unwound, the process ends as SIGTERM ends it.
    """
    import signal

    def terminate(number: int, _: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second SIGTERM (the group's) must not cut the unwinding
        raise _Terminated(128 + number)

    signal.signal(signal.SIGTERM, terminate)


def _end_by_sigterm() -> int:
    """End this process as an unhandled SIGTERM does; PID 1, which that spares, exits with status 143."""
    import signal

    print(f"{PREFIX} stopped by SIGTERM", file=sys.stderr, flush=True)
    sys.stdout.flush()
    _drop_stages()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1)  # the signal is delivered meanwhile, unless this is PID 1
    return 128 + signal.SIGTERM


_STAGES: list[str] = []  # local copies of URI checkpoint folders, removed when this process ends


def _drop_stages() -> None:
    import shutil

    for stage in _STAGES:
        shutil.rmtree(stage, ignore_errors=True)


def stage_from_uri(uri: str) -> str:
    """A local folder standing for the URI folder: the newest complete checkpoint there is downloaded into it.

    ``AIRFLOW_GPU_CHECKPOINT_DIR`` becomes that folder (Accelerate saves to local paths) and
    ``AIRFLOW_GPU_CHECKPOINT_URI`` the URI; :func:`upload_saves` copies each ``save_state`` back. Needs fsspec (and
    the store's own package and credentials) in the task's environment.
    """
    import atexit
    import re
    import tempfile

    import fsspec

    fs, root = fsspec.core.url_to_fs(uri)
    stage = tempfile.mkdtemp(prefix="airflow-gpu-checkpoint-")
    if not _STAGES:
        atexit.register(_drop_stages)
    _STAGES.append(stage)
    found = []
    for sub in ("", "checkpoints"):
        try:
            entries = fs.ls(f"{root.rstrip('/')}/{sub}".rstrip("/"), detail=True)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
            if entry["type"] == "directory" and fs.exists(f"{entry['name'].rstrip('/')}/{CHECKPOINT_MARKER}"):
                numbers = re.findall(r"[0-9]+", name)
                found.append((int(numbers[0]) if numbers else -1, name, sub, entry["name"].rstrip("/")))
    if found:
        _, name, sub, remote = max(found)
        fs.get(f"{remote}/", f"{os.path.join(stage, sub, name)}/", recursive=True)
        print(f"{PREFIX} resume: downloaded {uri.rstrip('/')}/{os.path.join(sub, name)}", flush=True)
    os.environ[CHECKPOINT_ENV], os.environ[CHECKPOINT_URI_ENV] = stage, uri
    print(f"{PREFIX} checkpoint folder staged locally ({CHECKPOINT_ENV}): {stage}", flush=True)
    return stage


def upload_saves() -> None:
    """With a staged URI folder: after each ``Accelerator.save_state`` into it, the saved folder is uploaded.

    Every process waits for the others to finish saving; one process per machine uploads (the ranks' files of a
    machine lie on its disk).
    """
    uri, stage = os.environ.get(CHECKPOINT_URI_ENV), os.environ.get(CHECKPOINT_ENV)
    if not uri or not stage:
        return
    import functools

    try:
        import fsspec
        from accelerate import Accelerator
    except Exception as exc:  # noqa: BLE001 - the function reports its own import errors
        print(f"{PREFIX} checkpoints stay in {stage}, not uploaded to {uri}: {type(exc).__name__}: {exc}", flush=True)
        return
    original = Accelerator.save_state

    @functools.wraps(original)
    def save_state(self: Any, *args: Any, **kwargs: Any) -> Any:
        saved = str(original(self, *args, **kwargs))
        self.wait_for_everyone()
        relative = os.path.relpath(saved, stage)
        if self.is_local_main_process and not relative.startswith(".."):
            fs, root = fsspec.core.url_to_fs(uri)
            fs.put(f"{saved}/", f"{root.rstrip('/')}/{relative}/", recursive=True)
            print(f"{PREFIX} uploaded {relative} to {uri}", flush=True)
        self.wait_for_everyone()
        return saved

    Accelerator.save_state = save_state


def resume_after_prepare() -> None:
    """Make the first ``Accelerator.prepare`` of this process load ``AIRFLOW_GPU_RESUME_FROM`` before returning.

    So the user's loop starts from the restored model, optimizer, scheduler, dataloader and RNG states; with
    ``AIRFLOW_GPU_RESUME_STEP`` = N, ``accelerator.project_configuration.iteration`` becomes N + 1 (the next
    automatically named checkpoint is ``checkpoint_<N+1>``, and a loop that saves once per epoch starts there).
    """
    path = os.environ.get(RESUME_FROM_ENV)
    if not path:
        return
    try:
        from accelerate import Accelerator
    except Exception as exc:  # noqa: BLE001 - the function reports its own import errors
        print(f"{PREFIX} resume: accelerate cannot be imported here ({exc}); load {path} yourself", flush=True)
        return
    import functools

    original = Accelerator.prepare
    step = os.environ.get(RESUME_STEP_ENV)

    @functools.wraps(original)
    def prepare(self: Any, *args: Any, **kwargs: Any) -> Any:
        prepared = original(self, *args, **kwargs)
        if Accelerator.prepare is prepare:  # the first call only
            Accelerator.prepare = original
            self.load_state(path)
            if step is not None:
                self.project_configuration.iteration = int(step) + 1
            print(f"{PREFIX} rank {self.process_index}: resumed from {path}", flush=True)
        return prepared

    Accelerator.prepare = prepare


# --------------------------------------------------------------------------------------------- a task try
def _start_profiler(envelope: dict[str, Any]) -> Profiler | None:
    """The task's sampler, when the envelope asks for one; one per node (``LOCAL_RANK`` 0 under a launcher)."""
    settings = envelope.get("profile")
    if not settings or os.environ.get("LOCAL_RANK", "0") != "0":
        return None
    try:
        return Profiler(float(settings.get("interval_s", 1.0)))
    except Exception as exc:  # noqa: BLE001 - the task runs without its profile
        print(f"{PREFIX} profile: not sampled ({type(exc).__name__}: {exc})", flush=True)
        return None


def run(envelope: dict[str, Any], source: str, result_to: str, *, rank: bool = False) -> int:
    """Run one envelope (read from ``source``) as the task process, or as one rank of a launch.

    :param result_to: where the result goes: a file, or ``-`` for the log
    :param rank: this process is one rank of a launch started by this runtime (no summary, no launcher, no sampler)
    """
    if envelope.get("die_with_parent") and not rank:
        _die_with_parent()
    clear = envelope.get("clear_cache", True)
    before = clear_cuda_cache() if clear else {"status": "skipped", "reason": "disabled", "freed_bytes": 0}
    profiler = None
    if not rank:
        summary = envelope.get("summary") or {}
        if "effective" in summary:  # for the user's code, its commands and a launcher's ranks
            os.environ[RESOURCES_ENV] = json.dumps(summary["effective"])
        print_summary(summary, before)
        prepare_checkpoint(envelope)
        profiler = _start_profiler(envelope)
        if envelope.get("launch"):
            return _run_launcher(envelope, source, result_to, profiler)
    if envelope["mode"] == "command":
        result, status = _run_command(envelope, profiler)
    else:
        if not rank:
            _exit_on_sigterm()
        if envelope.get("resume"):
            resume_after_prepare()
            upload_saves()
        try:
            result = _call_function(envelope)
        except _Terminated:
            return _end_by_sigterm()
        status = 0 if result["ok"] else EXIT_USER_ERROR
    after = clear_cuda_cache() if clear else before
    result["cache"] = [before, after]
    if profiler is not None:
        result["profile"] = profiler.stop()
    if result["ok"] and envelope["mode"] == "callable":
        who = f"rank {os.environ.get('RANK', '0')}: " if rank else ""
        print(
            f"{PREFIX} {who}{envelope['function']}() finished in {result['duration_s']:.2f}s; CUDA cache after task: "
            f"{_describe_cache(after)}",
            flush=True,
        )
    if rank or os.environ.get("RANK", "0") == "0":  # under another launcher, rank 0 reports for the group
        write_result(result_to, result)
    return status


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point: ``bootstrap.py ENVELOPE RESULT`` or ``bootstrap.py ENVELOPE --rank-results DIR``."""
    argv = sys.argv[1:] if argv is None else argv
    rank = len(argv) == 3 and argv[1] == RANK_RESULTS
    if len(argv) != 2 and not rank:
        print(f"usage: bootstrap.py ENVELOPE RESULT  |  bootstrap.py ENVELOPE {RANK_RESULTS} DIR", file=sys.stderr)
        return EXIT_BAD_ENVELOPE
    result_to = _rank_result_path(argv[2]) if rank else argv[1]
    try:
        envelope = load_envelope(argv[0])
    except (OSError, KeyError, ValueError) as exc:
        print(f"{PREFIX} unusable task envelope {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        write_result(result_to, {"ok": False, "error": _error(exc)})
        return EXIT_BAD_ENVELOPE
    return run(envelope, argv[0], result_to, rank=rank)


if __name__ == "__main__":
    sys.exit(main())
