"""What the GPU pages show of a profile: numbers as text, what a task asked for, and which task a row is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from airflow_gpu_provider.runtime.protocol import format_bytes
from airflow_gpu_provider.telemetry.profile import Profile, Share, number, text

GIB = 1024**3
MIB = 1024**2


def gib(value: float | None) -> str:
    """An amount of memory as every line of the provider shows it (``"6.1 GiB"``), or ``"–"``."""
    return "–" if value is None else format_bytes(value)


def pct(value: float | None) -> str:
    """A percentage (``"71 %"``), or ``"–"``."""
    return "–" if value is None else f"{value:.0f} %"


def fixed(value: float | None, unit: str = "", digits: int = 1) -> str:
    """A number with a unit (``"4.2 Wh"``), or ``"–"``."""
    return "–" if value is None else f"{value:.{digits}f}{' ' + unit if unit else ''}"


def duration(seconds: float | None) -> str:
    """``"45 s"``, ``"3 min 20 s"``, ``"2 h 05 min"``, or ``"–"``."""
    if seconds is None:
        return "–"
    whole = round(seconds)
    if seconds == 0:
        return "0 s"
    if whole < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def money(cost: dict[str, Any] | None) -> str:
    """The cost as ``"0.065 (A100-80GB at 2.50 per GPU-hour)"``, or ``"–"``."""
    amount = number((cost or {}).get("amount"))
    if cost is None or amount is None:
        return "–"
    price = number(cost.get("price_per_gpu_hour"))
    model = text(cost.get("model"), 80)
    detail = f" ({model} at {price:.2f} per GPU-hour)" if price is not None else ""
    return f"{amount:.3f}{detail}"


def shared(share: Share) -> str:
    """A try's share of one GPU: ``8.0 GiB (34 %) of GPU-…, enforced by mps``."""
    size = f"{gib(share.memory)} ({pct(share.percent)})" if share.memory else pct(share.percent)
    return f"{size} of GPU {share.gpu}, enforced by {share.enforcement}"


def requested(request: dict[str, Any]) -> str:
    """What the task asked for: ``"1× A100 (MIG 1g.10gb), 16.0 GiB memory, 4 CPUs"``."""
    count = request.get("gpu_count")
    model = text(request.get("accelerator"), 40) or "GPU"
    if request.get("mig_profile"):
        model += f" (MIG {text(request.get('mig_profile'), 20)})"
    share = number(request.get("gpu_share"))
    parts = [
        f"{gib(share)} of 1× {model}" if share else "no GPU" if count == 0 else f"all {model}s" if count == "all" else
        f"{number(count):g}× {model}" if number(count) is not None else ""
    ]  # fmt: skip
    memory = request.get("memory")
    if memory:  # bytes (the operator's parsed request) or the string as written ("16Gi")
        parts.append(f"{gib(number(memory))} memory" if number(memory) is not None else text(memory, 20))
    cpus = number(request.get("cpu_count"))
    if cpus is not None:
        parts.append(f"{cpus:g} CPU{'' if cpus == 1 else 's'}")
    return ", ".join(part for part in parts if part) or "–"


class TaskKey(NamedTuple):
    """A task instance: its DAG, run, task and map index (-1 when not mapped)."""

    dag_id: str
    run_id: str
    task_id: str
    map_index: int = -1

    @property
    def label(self) -> str:
        """``dag_id / task_id``, with ``[map_index]`` when mapped."""
        return f"{self.dag_id} / {self.task_id}" + (f" [{self.map_index}]" if self.map_index >= 0 else "")


@dataclass(frozen=True)
class TaskTry:
    """One try of a task instance: what Airflow recorded of it, and its profile when one was stored.

    :param state: the try's state (``None`` when Airflow keeps no record of the try, only its profile)
    :param started: :param ended: epoch seconds; :param hostname: the worker Airflow ran it on
    """

    number: int
    state: str | None
    started: float | None
    ended: float | None
    hostname: str
    profile: Profile | None


@dataclass(frozen=True)
class ProfileRow:
    """A profile with the XCom row it came from."""

    key: TaskKey
    stored: float  # epoch seconds the XCom row was written
    profile: Profile
    state: str | None = None  # how the try ended (try_state), None when unknown

    @staticmethod
    def try_state(ti_state: str | None, ti_try: int | None, profile_try: int | None) -> str | None:
        """How the profiled try ended: the task instance's state, ``failed`` for a try a later one followed."""
        if profile_try is not None and ti_try is not None and profile_try < ti_try:
            return "failed"  # a later try runs, or ran without a profile
        return {"up_for_retry": "failed", "up_for_reschedule": "failed"}.get(str(ti_state), ti_state)
