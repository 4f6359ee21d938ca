"""Retries that learn from out-of-memory failures: which rung of its ``on_oom`` ladder a try runs on, and why.

The history of a task's tries (what each ran with and how it ended) decides the rung. It lives in the task
instance's task state store (:mod:`.store`): the next try may run on another worker host, and a task instance's
XComs are cleared when its next try starts. It is deleted when the task succeeds; the whole history then goes to
XCom under :data:`XCOM_KEY`. :func:`rung_for` and :func:`record` are pure; :mod:`.store` does the I/O.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_gpu_provider.escalation import store
from airflow_gpu_provider.exceptions import (
    GpuOutOfMemoryError,
    HostOutOfMemoryError,
    InvalidSettingError,
    RemoteTaskError,
)
from airflow_gpu_provider.settings import ResourceSettings
from airflow_gpu_provider.settings.escalation import OomEscalation
from airflow_gpu_provider.settings.units import format_bytes
from airflow_gpu_provider.task.labels import task_labels

XCOM_KEY = "gpu_escalation"
# how a try ended: the runtime's error kinds, as the worker's exceptions carry them
GPU_OOM, HOST_OOM, ERROR = GpuOutOfMemoryError.kind, HostOutOfMemoryError.kind, RemoteTaskError.kind
KINDS = f"how each earlier try ended: {GPU_OOM!r}, {HOST_OOM!r} or {ERROR!r}"


@dataclass(frozen=True)
class Rung:
    """What one try runs with.

    :param resources: the task's resources after the ladder's steps so far
    :param min_gpu_memory: local and Docker: the GPU must have more memory than the one that ran out (bytes)
    :param exhausted: ``"GPU"`` or ``"memory"`` when the last try ran out of memory on the ladder's top step
    :param line: the log line that starts the try: the rung and why
    """

    resources: ResourceSettings
    min_gpu_memory: int | None
    exhausted: str | None
    line: str


_gib = format_bytes


def rung_for(
    on_oom: OomEscalation, resources: ResourceSettings, history: Sequence[Mapping[str, Any]], tries: int
) -> Rung:
    """The rung of try number ``tries`` of a task whose own resources are ``resources``, after ``history``."""
    gpu_ooms = sum(1 for entry in history if entry.get("kind") == GPU_OOM)
    host_ooms = sum(1 for entry in history if entry.get("kind") == HOST_OOM)
    climbed, exhausted = on_oom.climb(resources, gpu_ooms, host_ooms)
    failed = [entry["gpu_memory"] for entry in history if entry.get("kind") == GPU_OOM and entry.get("gpu_memory")]
    minimum = max(failed) if failed else None
    steps = len(on_oom.gpu_steps(resources)), len(on_oom.memory_steps(resources))
    where = f"GPU step {min(gpu_ooms, steps[0])}/{steps[0]}, memory step {min(host_ooms, steps[1])}/{steps[1]}"
    if not gpu_ooms and not host_ooms:
        why = f"the task's own resources; on out of memory: {on_oom.describe()}"
    else:
        last = next(entry for entry in reversed(history) if entry.get("kind") in (GPU_OOM, HOST_OOM))
        what = "GPU" if last["kind"] == GPU_OOM else "host"
        ran, ran_with = last.get("gpu_model"), last.get("resources") or {}
        ran = ran or ran_with.get("accelerator")
        shared = "a share of " if ran_with.get("gpu_share") or isinstance(ran_with.get("gpu_count"), float) else ""
        on = f" on {shared}{ran}" if what == "GPU" and ran else ""
        on += f" ({_gib(last['gpu_memory'])})" if what == "GPU" and last.get("gpu_memory") else ""
        why = f"try {last.get('try')} ran out of {what} memory{on}"
        if minimum is not None:
            why += f"; this try needs a GPU with more than {_gib(minimum)}"
    line = f"[gpu] try {tries}: OOM escalation {where}: {climbed.describe()} ({why})"
    return Rung(climbed, minimum, exhausted, line)


def record(tries: int, resources: ResourceSettings, error: BaseException | None) -> dict[str, Any]:
    """One history entry: try ``tries`` ran with ``resources`` and ended with ``error`` (``None``: success)."""
    kind = "success" if error is None else getattr(error, "kind", ERROR)
    entry: dict[str, Any] = {"try": tries, "kind": kind, "resources": resources.to_dict(), "at": time.time()}
    if kind == GPU_OOM:
        gpus = error.gpus if isinstance(error, RemoteTaskError) else []
        sizes = [g["memory_total"] for g in gpus if isinstance(g.get("memory_total"), int)]
        total = min(sizes) if sizes else None  # the GPUs it ran on; none after a CPU fallback
        share = resources.share  # a share ran out of its own part of the GPU
        entry["gpu_memory"] = share.memory_on(total) if share is not None and total is not None else total
        entry["gpu_model"] = next((g.get("name") for g in gpus if g.get("name")), resources.accelerator)
    if error is not None:
        entry["error"] = f"{type(error).__name__}: {error}"[:500]
    return entry


@dataclass
class Tries:
    """One task instance's tries under an ``on_oom`` ladder, seen from the try that runs now.

    :param state_store: the task instance's task state store (``None``: the history was given, to render a later try)
    """

    on_oom: OomEscalation
    labels: Mapping[str, str]
    history: list[dict[str, Any]]
    number: int  # this try's number
    state_store: Any = None

    @classmethod
    def start(cls, on_oom: OomEscalation, context: Mapping[str, Any]) -> Tries:
        """The tries so far, from the task instance's task state store (``store.py``)."""
        labels = task_labels(context["ti"])
        number = int(labels.get("try_number") or 1)
        state_store = context.get("task_state_store")
        return cls(on_oom, labels, store.load(state_store, number), number, state_store)

    @classmethod
    def after(cls, on_oom: OomEscalation, labels: Mapping[str, str], kinds: Sequence[str]) -> Tries:
        """Tries that ended with ``kinds`` (``"gpu_oom"``, ``"host_oom"``, ``"error"``): to render the next one."""
        unknown = [kind for kind in kinds if kind not in (GPU_OOM, HOST_OOM, ERROR)]
        if unknown:
            raise InvalidSettingError("render_manifests", "after", list(kinds), f"unknown {unknown}", KINDS)
        history = [{"try": n, "kind": kind} for n, kind in enumerate(kinds, 1)]
        return cls(on_oom, labels, history, len(history) + 1)

    def rung(self, resources: ResourceSettings) -> Rung:
        """The rung of this try, for the task's own (rendered) ``resources``."""
        return rung_for(self.on_oom, resources, self.history, self.number)

    def finish(self, resources: ResourceSettings, error: BaseException | None) -> dict[str, Any]:
        """Record how this try ended; keep the history for the next try, or forget it on success.

        :returns: what goes to XCom under :data:`XCOM_KEY`
        """
        earlier = bool(self.history)
        self.history.append(record(self.number, resources, error))
        if error is not None:
            store.save(self.state_store, self.history)
        elif earlier:
            store.forget(self.state_store)
        return {"on_oom": self.on_oom.describe(), "tries": self.history}
