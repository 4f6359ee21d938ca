"""TEST DATA: realistic ``gpu_profile`` XCom values, one of each kind, and an ``on_oom`` history.

``GPU_PROFILE``: a 93 s training try on two A100-80GB cards of ``worker-1`` (device 1 mostly idle), with power,
temperature and SM clock series, advice and a cost (schema version 1, as older workers wrote it).
``CPU_PROFILE``: the same pipeline on a host without GPUs (CPU % and RSS of the task's process tree; version 1).
``FALLBACK_PROFILE``: version 2, a Docker try that fell back to the CPU, sampled in a container on a busy host.
``ESCALATION``: the ``gpu_escalation`` XCom of a task whose try 1 ran out of GPU memory on an L4 and whose try 2
succeeded on an A100-80GB, as ``escalation/tries.py`` records it. All made up for the UI's tests; the numbers are
plausible, the series deterministic.
"""

from __future__ import annotations

import copy
import math
from typing import Any

GIB = 2**30
A100_80GB = 85_899_345_920
STARTED = 1_795_442_000.0  # 2026-11-23 13:53:20 UTC


def _wave(n: int, base: float, amplitude: float, period: float, warmup: int = 5) -> list[float]:
    """``n`` samples: a ramp for ``warmup`` samples, then ``base`` +- ``amplitude`` with a period."""
    return [
        round(base * min(1.0, i / warmup) + amplitude * math.sin(2 * math.pi * i / period) * (i >= warmup), 1)
        for i in range(n)
    ]


def _gpu_profile() -> dict[str, Any]:
    n = 93
    util0 = [min(100.0, max(0.0, v)) for v in _wave(n, 78.0, 20.0, 11.0)]
    util1 = [min(100.0, max(0.0, v)) for v in _wave(n, 3.0, 2.0, 17.0)]
    memory0 = [round(min(1.0, i / 8) * 6.1 * GIB - (i % 9) * 12 * 2**20) for i in range(n)]
    memory1 = [round(min(1.0, i / 8) * 0.5 * GIB) for i in range(n)]
    return {
        "version": 1,
        "kind": "gpu",
        "host": "worker-1",
        "interval_s": 1.0,
        "started": STARTED,
        "duration_s": 93.2,
        "samples": n,
        "devices": [
            {
                "index": "0",
                "uuid": "GPU-5a1c0c11-2f0e-4d6b-9a52-3c1b1f0e9d01",
                "name": "NVIDIA A100-SXM4-80GB",
                "memory_total": A100_80GB,
                "mean_util": 71.3,
                "p95_util": 98.0,
                "peak_memory": 6_549_825_126,
                "peak_memory_pct": 7.6,
                "energy_wh": 4.2,
                "idle_s": 12.0,
                "peak_power_w": 310.0,
                "max_temperature_c": 61,
            },
            {
                "index": "1",
                "uuid": "GPU-7d3e9f22-8b1a-4c5d-b0e4-6f2a3d4c5e02",
                "name": "NVIDIA A100-SXM4-80GB",
                "memory_total": A100_80GB,
                "mean_util": 2.9,
                "p95_util": 5.0,
                "peak_memory": 536_870_912,
                "peak_memory_pct": 0.6,
                "energy_wh": 1.6,
                "idle_s": 93.0,
                "peak_power_w": 72.0,
                "max_temperature_c": 38,
            },
        ],
        "series": {
            "t": [float(i) for i in range(n)],
            "0": {
                "util": util0,
                "memory_used": memory0,
                "power_w": [round(60 + 2.4 * u, 1) for u in util0],
                "temperature_c": [min(61, 34 + i // 3) for i in range(n)],
                "sm_clock_mhz": [1410 if u > 5 else 210 for u in util0],
            },
            "1": {"util": util1, "memory_used": memory1, "power_w": [round(55 + 2 * u, 1) for u in util1]},
        },
        "task": {
            "dag_id": "gpu_training_demo",
            "run_id": "manual__2026-11-23T13:00:00+00:00",
            "task_id": "train",
            "map_index": -1,
            "try_number": 1,
            "backend": "local",
        },
        # as the operator writes it: memory in bytes (ResourceSettings parsed "16Gi")
        "requested": {"gpu_count": 2, "accelerator": "A100", "mig_profile": None, "memory": 16 * GIB, "cpu_count": 4},
        "gpu_seconds": 186.4,
        "advice": [
            "peak 6.1 GiB of 80 GiB (8 %): an A10G or MIG 1g.10gb would do",
            "GPU 1: mean utilisation 3 %: one GPU fewer would do",
        ],
        "cost": {"model": "A100-80GB", "price_per_gpu_hour": 2.5, "gpu_hours": 0.052, "amount": 0.129},
    }


def _cpu_profile() -> dict[str, Any]:
    n = 41
    util = [min(100.0, max(0.0, v)) for v in _wave(n, 68.0, 18.0, 7.0, warmup=3)]
    rss = [round((180 + 9 * min(i, 20)) * 2**20) for i in range(n)]
    return {
        "version": 1,
        "kind": "cpu",
        "host": "ci-runner-7",
        "interval_s": 1.0,
        "started": STARTED + 600,
        "duration_s": 40.6,
        "samples": n,
        "devices": [
            {
                "index": "cpu",
                "uuid": "",
                "name": "CPU (task process tree, 2 cores)",
                "memory_total": 16 * GIB,
                "mean_util": 68.5,
                "p95_util": 87.0,
                "peak_memory": max(rss),
                "peak_memory_pct": round(100 * max(rss) / (16 * GIB), 1),
                "energy_wh": None,
                "idle_s": 3.0,
                "peak_power_w": None,
                "max_temperature_c": None,
            }
        ],
        "series": {"t": [float(i) for i in range(n)], "cpu": {"util": util, "memory_used": rss}},
        "task": {
            "dag_id": "gpu_training_demo",
            "run_id": "manual__2026-11-23T13:10:00+00:00",
            "task_id": "train",
            "map_index": -1,
            "try_number": 2,
            "backend": "docker",
        },
        "requested": {"gpu_count": 1, "accelerator": None, "mig_profile": None, "memory": None, "cpu_count": 2},
        "gpu_seconds": 0.0,
        "advice": ["no GPU on this host: the task ran on the CPU (on_missing_gpu='cpu')"],
        "cost": None,
    }


def _fallback_profile() -> dict[str, Any]:
    profile = copy.deepcopy(_cpu_profile())
    reason = "the Docker engine cannot start GPU containers (could not select device driver)"
    profile.update(
        version=2,
        host="worker-2.example.com",
        node="3f2a9c1b7d4e",
        host_cpu={"source": "/proc/pressure/cpu", "scope": "host", "cpus": 8, "pressure_pct": 46.3, "peak_avg10": 81.2},
        cpu_fallback=True,
        cpu_fallback_reason=reason,
        advice=[
            f"ran on the CPU instead of its GPUs (on_missing_gpu='cpu'): {reason}",
            "mean utilisation 31 %: the CPUs often waited: the host was busy (CPU pressure 46 %)",
        ],
    )
    profile["devices"][0]["mean_util"] = 31.0
    return profile


def _resources(accelerator: str, memory: int) -> dict[str, Any]:
    return {"gpu_count": 1, "accelerator": accelerator, "mig_profile": None, "memory": memory, "cpu_count": 4,
            "shm_size": None, "gpu_vendor": "nvidia"}  # fmt: skip


ESCALATION: dict[str, Any] = {
    "on_oom": "accelerators=L4 -> A100-80GB",
    "tries": [
        {
            "try": 1,
            "kind": "gpu_oom",
            "resources": _resources("L4", 16 * GIB),
            "at": STARTED + 120.25,
            "gpu_memory": 24 * GIB,
            "gpu_model": "NVIDIA L4",
            "error": "GpuOutOfMemoryError: The task ran out of GPU memory",
        },
        {"try": 2, "kind": "success", "resources": _resources("A100-80GB", 32 * GIB), "at": STARTED + 400.5},
    ],
}
GPU_PROFILE: dict[str, Any] = _gpu_profile()
CPU_PROFILE: dict[str, Any] = _cpu_profile()
FALLBACK_PROFILE: dict[str, Any] = _fallback_profile()


def hostile(profile: dict[str, Any]) -> dict[str, Any]:
    """A copy with markup in every free-text field a DAG author or host could influence."""
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>"\'&'
    copied = copy.deepcopy(profile)
    copied["host"] = f"host{evil}"
    copied["advice"] = [f"advice{evil}"]
    copied["devices"][0]["name"] = f"name{evil}"
    copied["devices"][0]["index"] = f"0{evil}"
    copied["series"][f"0{evil}"] = copied["series"].pop(profile["devices"][0]["index"])
    copied["task"]["backend"] = f"local{evil}"
    copied["requested"]["accelerator"] = f"A100{evil}"
    if copied["cost"]:
        copied["cost"]["model"] = f"A100{evil}"
    return copied
