"""Right-sizing that acts: a ``right_size=True`` task asks for the smallest GPU that held its last successful run.

The evidence is the profile that run kept in XCom (``gpu_profile``, :mod:`.report`), found through the task SDK's
``get_previous_ti(state="success")`` (without that call, no try is right-sized): its devices' largest peak memory.
A try needs a GPU holding that peak times :data:`~.advice.HEADROOM` (1.2, the advice's own headroom); the host
allocator (local and Docker: ``host/inventory.right_sized``) takes the smallest matching GPU or MIG slice that does.
A share of a GPU (``gpu_count=0.25``, ``gpu_share``) becomes a share of that size instead (``right_sized_share``).
On Slurm a share becomes the shards of that size (``backends/slurm/shards.py``); the other backends place by a
model name or a resource count: ``right_size=True`` is refused there at parse (``BackendInfo.right_sizes``).

Only a run's first try is right-sized, never one after an out-of-memory failure: a retry runs with the task's own
resources (and its ``on_oom`` rung), so an OOM climbs the ladder as it would without right-sizing. The decision goes
to the log, to the task instance's task state store (:data:`STATE_KEY`) and, with the try's profile, to XCom and the
GPU tab. Reading the last run never fails the task: it then runs as declared, and its log says why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_gpu_provider.telemetry import XCOM_KEY
from airflow_gpu_provider.telemetry.advice import HEADROOM, gib
from airflow_gpu_provider.telemetry.profile import Profile

if TYPE_CHECKING:
    from airflow_gpu_provider.escalation.tries import Tries
    from airflow_gpu_provider.task.request import TaskRequest

STATE_KEY = "airflow_gpu_provider.right_size"


def decision(
    profile: Mapping[str, Any] | None, run_id: str, try_number: int, *, share: bool = False
) -> dict[str, Any] | None:
    """What a try asks for after the successful run ``run_id`` left ``profile``; ``None`` without a GPU peak.

    :param share: the task asks for a share of a GPU, which becomes the need (else: the smallest GPU that holds it)
    """
    read = Profile.read(profile) if profile else None
    if read is None or read.is_cpu:
        return None
    peaks = [(d.peak_memory, d) for d in read.devices if d.peak_memory]
    if not peaks:
        return None
    peak, device = max(peaks, key=lambda pair: pair[0])
    need = int(peak * HEADROOM)
    line = (
        f"right_size: run {run_id} (try {try_number}) peaked at {gib(peak)} on {device.name} "
        f"({gib(device.memory_total)}); x {HEADROOM:g} headroom: "
        + (f"a share of {gib(need)} of a GPU" if share else f"a GPU or MIG slice with at least {gib(need)}")
    )
    return {
        "need": need,
        "peak": int(peak),
        "headroom": HEADROOM,
        "from_run_id": run_id,
        "from_try": try_number,
        "from_gpu": device.name,
        "line": line,
    }


def skipped_because(try_number: int, history: Sequence[Mapping[str, Any]]) -> str | None:
    """Why this try is not right-sized (a retry, one after an out-of-memory failure above all), else ``None``."""
    ooms = [entry.get("try") for entry in history if entry.get("kind") in ("gpu_oom", "host_oom")]
    if ooms:
        return f"try {ooms[-1]} ran out of memory: this try climbs the on_oom ladder from the task's own resources"
    if try_number > 1:
        return "a retry runs with the task's own resources"
    return None


def previous_success(ti: Any) -> tuple[Mapping[str, Any] | None, str, int] | None:
    """The profile, run id and try of the task instance's last successful run, or ``None`` (none, or Airflow < 3.2)."""
    previous = getattr(ti, "get_previous_ti", None)
    if previous is None:
        return None
    from airflow.utils.state import TaskInstanceState

    found = previous(state=TaskInstanceState.SUCCESS, map_index=ti.map_index)
    if found is None:
        return None
    profile = ti.xcom_pull(task_ids=ti.task_id, key=XCOM_KEY, run_id=found.run_id, map_indexes=ti.map_index)
    return profile, found.run_id, found.try_number


def applied(request: TaskRequest, wanted: bool, tries: Tries | None, context: Any, log: Any) -> TaskRequest:
    """``request`` right-sized when the task asks for it and its last successful run left a GPU peak.

    :param wanted: the task's ``right_size=True``
    """
    if not wanted or not request.resources.requests_gpus:
        return request
    number = int(request.labels.get("try_number") or 1)
    why = skipped_because(number, tries.history if tries is not None else ())
    if isinstance(request.resources.gpu_count, str):
        why = "gpu_count='all' takes every matching GPU of the host"
    found = None
    if why is None:
        try:
            found = previous_success(context["ti"])
        except Exception as err:  # noqa: BLE001 - right-sizing never fails the task: it runs as declared
            why = f"the last successful run could not be read ({type(err).__name__}: {err})"
    chosen = decision(*found, share=request.resources.share is not None) if found is not None else None
    if chosen is None:
        why = why or "no earlier successful run of this task left a GPU profile (peak memory)"
        log.info("[gpu] right_size: not right-sized: %s", why)
        return request
    log.info("[gpu] %s", chosen["line"])
    state_store = context.get("task_state_store")  # None before Airflow 3.3: the log and the profile keep it
    if state_store is not None:
        state_store.set(STATE_KEY, {**chosen, "try": number})
    return dataclasses.replace(request, right_size=chosen)
