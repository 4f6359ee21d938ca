"""The worker's half of a GPU task's profile: ask for it in the envelope, complete it, log it, store it.

The runtime samples (``runtime/telemetry/sampler.py``) and returns the series and a per-device summary with the result
envelope; here the profile (read as :class:`~.profile.Profile`) gets the task's identity, what it asked for, the
advice and the cost, then goes to XCom under :data:`XCOM_KEY` (the return value keeps ``return_value``), to the task
instance's task state store under a key of its own try (:func:`try_key`: Airflow clears a task instance's XComs when
its next try starts, the store keeps every try's), to the end of the log, and to Airflow's metrics (``metrics.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_gpu_provider.settings.accelerators import MODEL_VENDORS
from airflow_gpu_provider.task.request import TaskRequest
from airflow_gpu_provider.task.result import failure_class_of
from airflow_gpu_provider.telemetry import TRY_KEY_PREFIX, XCOM_KEY, metrics, stored
from airflow_gpu_provider.telemetry.advice import advice, cost, gib, parse_prices
from airflow_gpu_provider.telemetry.profile import Profile

if TYPE_CHECKING:
    from airflow_gpu_provider.config.worker import GpuConfig


def envelope_section(conf: GpuConfig) -> dict[str, Any] | None:
    """What the runtime needs to sample (``envelope["profile"]``), or ``None`` when ``[gpu] profile_interval`` is 0.

    ``host`` is this worker's host name as Airflow records it for the task instance (``[core] hostname_callable``):
    inside a container or pod the sampler's own name is the container's id or the pod's name.
    """
    if not conf.profile_interval:
        return None
    from airflow.utils.net import get_hostname

    return {"interval_s": conf.profile_interval, "host": get_hostname()}


def try_key(try_number: int) -> str:
    """The task state store key of one try's profile: ``airflow_gpu_provider.gpu_profile.try_3``."""
    return f"{TRY_KEY_PREFIX}{try_number}"


def complete(
    profile: Mapping[str, Any], request: TaskRequest, backend: str, prices: Mapping[str, float]
) -> dict[str, Any]:
    """The runtime's profile with the task's identity, its request, GPU-seconds, advice and cost (at ``prices``)."""
    resources = request.resources
    gpu_count = resources.gpu_count if isinstance(resources.gpu_count, int) else None
    labels = request.labels
    read = Profile.read(profile)
    if read is None:
        raise ValueError(f"not a profile of a supported version: {str(profile)[:200]}")
    completed = dict(profile)
    completed.update(
        task={
            "dag_id": labels.get("dag_id"),
            "run_id": labels.get("run_id"),
            "task_id": labels.get("task_id"),
            "map_index": int(labels.get("map_index", "-1") or -1),
            "try_number": int(labels.get("try_number", "0") or 0),
            "backend": backend,
        },
        requested={
            "gpu_count": resources.gpu_count,
            **({"gpu_share": resources.gpu_share} if resources.gpu_share is not None else {}),
            "accelerator": resources.accelerator,
            "mig_profile": resources.mig_profile,
            "memory": resources.memory,
            "cpu_count": resources.cpu_count,
        },
        gpu_seconds=0.0 if read.is_cpu else round(len(read.devices) * (read.duration_s or 0), 3),
        advice=advice(read, gpu_count=gpu_count),
        cost=cost(read, prices, accelerator=_nvidia(resources.accelerator)),
    )
    if request.right_size:  # the decision (telemetry/right_size.py) and what the try ran on
        ran_on = ", ".join(f"{d.name} ({gib(d.memory_total)})" for d in read.devices)
        line = f"{request.right_size['line']}; ran on {ran_on}"
        completed["right_size"] = {**request.right_size, "ran_on": ran_on, "line": line}
    return completed


def _nvidia(model: str | None) -> str | None:
    return None if model is None or model in MODEL_VENDORS else model


def summary_lines(profile: Profile) -> list[str]:
    """The lines that end the task log: one per device, then the advice and the cost."""
    kind = "CPU profile (no GPU telemetry)" if profile.is_cpu else "GPU profile"
    where = profile.host + (f" (in {profile.node})" if profile.node and profile.node != profile.host else "")
    lines = [
        f"profile: {kind} of {profile.duration_s or 0:.1f}s, {profile.samples} samples every "
        f"{profile.interval_s or 0:g}s on {where}"
    ]
    if profile.cpu_fallback:
        lines.append(f"  CPU fallback (on_missing_gpu='cpu'): {profile.cpu_fallback_reason}")
    if profile.share is not None:
        lines.append(f"  {profile.share.line}")
    for device in profile.devices:
        mean, p95 = device.mean_util, device.p95_util
        util = "?" if mean is None else f"mean {mean:.0f} %" + ("" if p95 is None else f", p95 {p95:.0f} %")
        pct = device.peak_memory_pct
        memory = f"peak {gib(device.peak_memory)} of {gib(device.memory_total)}"
        memory += "" if pct is None else f" ({pct:.0f} %)"
        energy = "" if device.energy_wh is None else f", {device.energy_wh:.2f} Wh"
        what = device.name if profile.is_cpu else f"GPU {device.index} {device.name}"
        lines.append(f"  {what}: utilisation {util}; memory {memory}; idle {device.idle_s or 0:.0f}s{energy}")
    host_cpu = profile.host_cpu
    if host_cpu is not None:
        peak = "" if host_cpu.peak_avg10 is None else f", 10-s peak {host_cpu.peak_avg10:.0f} %"
        lines.append(f"  host CPUs: {host_cpu.describe()}{peak} ({host_cpu.source}, {host_cpu.scope} view)")
    lines += [f"right-sized: {profile.right_size}"] if profile.right_size else []
    lines += [f"advice: {note}" for note in profile.advice]
    spent = profile.cost
    if spent:
        rate = spent.get("price_per_gpu_hour")
        lines.append(
            f"cost: {spent['amount']:.4f} for {spent['gpu_hours']:.4f} device-hours of {spent['model']}"
            + ("" if rate is None else f" at {rate:g} per hour")
        )
    if profile.error:
        lines.append(f"profile incomplete: {profile.error}")
    return lines


def _store(context: Any, completed: dict[str, Any]) -> None:
    """The profile to XCom and to the try's task state store key."""
    context["ti"].xcom_push(key=XCOM_KEY, value=completed)
    state_store = context.get("task_state_store")  # None before Airflow 3.3: only the latest try's is kept
    if state_store is not None and completed["task"]["try_number"] > 0:
        state_store.set(try_key(completed["task"]["try_number"]), completed)


def publish(
    profile: Mapping[str, Any] | None,
    request: TaskRequest,
    backend: str,
    *,
    context: Any,
    log: Any,
    conf: GpuConfig,
    failure: BaseException | None = None,
) -> dict[str, Any] | None:
    """Complete the profile, store it (XCom, the try's key), log it and send its metrics. Never raises.

    A success's profile is stored once the task instance is ``success`` (``stored.py``): off the GPU's hand-over.

    :param failure: the error the try ended with (``None``: it succeeded), whose class tags the metrics
    """
    if not profile:
        return None
    try:
        prices = parse_prices(conf.prices)
    except ValueError as err:
        log.warning("[gpu] No cost in the profile: %s", err)
        prices = {}
    try:
        completed = complete(profile, request, backend, prices)
        for line in summary_lines(Profile.read(completed)):  # type: ignore[arg-type]  # complete() read it
            log.info("[gpu] %s", line)
        store = functools.partial(_store, context, completed)
        stored.later(store) if failure is None else store()  # a success's after its state: off the hand-over
        outcome = "success" if failure is None else (failure_class_of(failure) or ("failed", ""))[0]
        metrics.emit(Profile.read(completed), outcome, log)  # type: ignore[arg-type]
    except Exception as err:  # noqa: BLE001 - the task's own outcome stands
        log.warning("[gpu] The task's profile could not be stored: %s: %s", type(err).__name__, err)
        return None
    return completed
