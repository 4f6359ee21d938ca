"""What a profile means: right-sizing advice and the cost of the GPU time, from the runtime's per-device summary.

Pure: the profile in, strings and numbers out. The rules, each from one figure of one device:

========================  ==================================================================================
peak memory < 50 %        the smallest card (and, on a MIG-capable card, the smallest MIG slice) that holds
                          the peak with 20 % headroom
peak memory >= 90 %       close to OOM
mean utilisation < 10 %   mostly idle (data loading?), or the host was busy when its CPU pressure says so
10 % <= mean < 40 %       waiting on something (input pipeline, small batches), or the host was busy
a device never used       fewer GPUs would do
a CPU fallback            the task ran on the CPU instead of its GPUs, and why
========================  ==================================================================================

"The host was busy" replaces the guess at the task's own input pipeline when, over the try, runnable processes of
the host waited for a CPU at least :data:`HOST_BUSY_PCT` % of the time (PSI ``some``, or its load-average estimate).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_gpu_provider.runtime.protocol import format_bytes
from airflow_gpu_provider.settings.accelerators import MEMORY_GIB, MIG_PROFILES, MODEL_VENDORS, mig_memory_gib
from airflow_gpu_provider.telemetry.profile import Device, HostCpu, Profile

GIB = 2**30
HEADROOM = 1.2  # a smaller card must hold the peak and a fifth more
IDLE_MEAN = 10.0
BUSY_MEAN = 40.0
FULL_PCT = 90.0
ROOMY_PCT = 50.0
HOST_BUSY_PCT = 20.0  # the host's CPUs were too few this share of the try: it explains a task that waited


def model_of(name: str, memory_total: float | None) -> str | None:
    """The accelerator model of an NVML device name: ``NVIDIA A100-SXM4-80GB`` is ``A100-80GB``."""
    upper = name.upper()
    for model in sorted(MEMORY_GIB, key=len, reverse=True):  # "A100-80GB" before "A100", "L40S" before "L4"
        base, large = (model.removesuffix("-80GB"), model.endswith("-80GB"))
        if not re.search(rf"(?<![A-Z0-9]){re.escape(base)}(?![A-Z0-9])", upper):
            continue
        if large and not (memory_total and memory_total > 48 * GIB):
            continue
        return model
    return None


gib = format_bytes  # an amount of memory as the profile's lines show it: ``6.1 GiB`` (``?`` when unknown)


def smaller_fits(peak: float, total: float, model: str | None, vendor_models: Sequence[str]) -> list[str]:
    """The smallest card of ``vendor_models`` and MIG slice of ``model`` that hold ``peak`` with headroom."""
    need = peak * HEADROOM / GIB
    own = MEMORY_GIB.get(model or "", total / GIB)
    cards = sorted((MEMORY_GIB[m], m) for m in vendor_models if need <= MEMORY_GIB[m] < own)
    fits = [cards[0][1]] if cards else []
    slices = sorted((mig_memory_gib(p), p) for p in MIG_PROFILES.get(model or "", ()) if need <= mig_memory_gib(p))
    if slices:
        fits.append(f"MIG {slices[0][1]}")
    return fits


def host_busy(host_cpu: HostCpu | None) -> str | None:
    """``the host was busy (CPU pressure 55 %)`` when the host's CPUs were too few often enough, else None."""
    if host_cpu is None or host_cpu.pressure_pct is None or host_cpu.pressure_pct < HOST_BUSY_PCT:
        return None
    where = "the host" if host_cpu.scope == "host" else "the container"
    return f"{where} was busy ({host_cpu.describe()})"


def device_advice(device: Device, *, cpu: bool, vendor_models: Sequence[str], busy: str | None = None) -> list[str]:
    """The advice for one device of a profile (a GPU, or the task's CPUs for a CPU profile).

    :param busy: :func:`host_busy`'s words, when the host's CPU pressure explains a device that waited
    """
    subject = "the CPUs" if cpu else "the GPU"
    what = f"{subject} {'were' if cpu else 'was'}"
    label = "" if cpu else f"GPU {device.index}: "
    notes: list[str] = []
    mean, peak, pct, total = device.mean_util, device.peak_memory, device.peak_memory_pct, device.memory_total
    if peak is not None and total and pct is not None:
        if pct >= FULL_PCT:
            notes.append(f"{label}memory {pct:.0f} % full ({gib(peak)} of {gib(total)}): close to OOM")
        elif pct < ROOMY_PCT and not cpu:
            fits = smaller_fits(peak, total, model_of(device.name, total), vendor_models)
            if fits:
                notes.append(f"{label}peak {gib(peak)} of {gib(total)} ({pct:.0f} %): {' or '.join(fits)} would do")
    if mean is not None:
        if mean < IDLE_MEAN:
            why = f": {busy}" if busy else " (data loading? waiting?)"
            notes.append(f"{label}mean utilisation {mean:.0f} %: {what} mostly idle{why}")
        elif mean < BUSY_MEAN:
            why = f": {busy}" if busy else " (input pipeline, small batches?)"
            notes.append(f"{label}mean utilisation {mean:.0f} %: {subject} often waited{why}")
    return notes


def advice(profile: Profile, *, gpu_count: int | None = None) -> list[str]:
    """Right-sizing advice for a whole profile; an empty list when the task fit its resources well."""
    cpu = profile.is_cpu
    devices = profile.devices
    vendor_models = [m for m in MEMORY_GIB if m not in MODEL_VENDORS]  # NVML reports NVIDIA cards
    busy = host_busy(profile.host_cpu)
    notes = []
    if profile.cpu_fallback:
        notes.append(f"ran on the CPU instead of its GPUs (on_missing_gpu='cpu'): {profile.cpu_fallback_reason}")
    for device in devices:
        notes += device_advice(device, cpu=cpu, vendor_models=vendor_models, busy=busy)
    unused = [d.index for d in devices if not cpu and (d.p95_util or 0) == 0 and (d.mean_util or 0) < 1]
    if len(devices) > 1 and unused:
        notes.append(
            f"GPU {', '.join(unused)} never ran a kernel: the task used {len(devices) - len(unused)} of "
            f"{len(devices)} GPUs (ask for fewer, or spread the work with Accelerate)"
        )
    if gpu_count and not cpu and len(devices) < gpu_count:
        notes.append(f"{len(devices)} of the {gpu_count} GPUs asked for were visible to the task")
    return notes


def parse_prices(text: str) -> dict[str, float]:
    """``[gpu] prices``: ``A100-80GB=3.2, H100=4.1`` (model names case-insensitive; ``cpu`` prices a CPU profile)."""
    prices: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        model, sep, amount = item.partition("=")
        try:
            value = float(amount)
        except ValueError:
            value = -1.0
        if not sep or not model.strip() or not 0 <= value < float("inf"):
            raise ValueError(
                f"[gpu] prices: {item!r} is not MODEL=PRICE; accepted: 'A100-80GB=3.2, H100=4.1' (price per GPU-hour)"
            )
        prices[model.strip().upper()] = value
    return prices


def cost(profile: Profile, prices: Mapping[str, float], *, accelerator: str | None = None) -> dict[str, Any] | None:
    """What the try's devices cost at ``prices`` per device-hour, or ``None`` when no price applies.

    A device is priced by the model NVML names, else by the task's ``accelerator``; a CPU profile by ``cpu``.
    """
    hours = (profile.duration_s or 0) / 3600
    amount, models, rates = 0.0, [], set()
    for device in profile.devices:
        if profile.is_cpu:
            model: str | None = "cpu"
        else:
            model = model_of(device.name, device.memory_total) or accelerator
        rate = prices.get((model or "").upper())
        if rate is None:
            return None
        amount += rate * hours
        models.append(model)
        rates.add(rate)
    if not models:
        return None
    return {
        "model": ", ".join(sorted(set(map(str, models)))),
        "price_per_gpu_hour": rates.pop() if len(rates) == 1 else None,
        "gpu_hours": round(hours * len(models), 6),
        "amount": round(amount, 4),
    }
