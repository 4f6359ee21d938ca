"""Where the history of a task instance's tries lives between its tries: Airflow's task state store (AIP-103).

The next try may run on another worker host, and a task instance's XComs are cleared when its next try starts, so
the history goes to the metadata DB, in the task state store of the task instance itself: visible in its Task State
Store tab, deleted when the task succeeds, and written by nothing but that task instance — another DAG cannot forge
it (rule T2 of docs/security.md). What is read back is still checked entry by entry.

It never ages out: Airflow's store expires a key after ``[state_store] default_retention_days`` (30) unless it is
written with ``NEVER_EXPIRE``, and a ladder must not silently start again at its first rung because a failed task
was cleared a month later. So the history is kept until the task succeeds, or until its DAG run is deleted (``airflow
db clean``, or the run deleted in the UI: the store's rows go with their run), and it stays small (at most
:data:`MAX_ENTRIES`). What the task state store holds besides (the nodes an infrastructure failure avoids, every
try's profile) takes Airflow's default retention: docs/resilience.md says what is forgotten when.

On an Airflow without the store (before 3.3) the history cannot travel between tries: each try runs on the task's
own resources, and the log says so.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_gpu_provider.runtime import protocol

KEY = "airflow_gpu_provider.oom_history"
KINDS = frozenset({protocol.GPU_OOM, protocol.HOST_OOM, protocol.ERROR, protocol.INFRASTRUCTURE, "success"})
MAX_ENTRIES = 100  # more tries than any task has: the rest is not a history
log = logging.getLogger(__name__)


def _entry(value: Any, before: int) -> dict[str, Any] | None:
    """One entry as a try recorded it (``tries.record``), or ``None``."""
    if not isinstance(value, dict) or value.get("kind") not in KINDS:
        return None
    number, memory = value.get("try"), value.get("gpu_memory")
    # this try's own number too: a run of it that was rescheduled ([gpu] infra_retries) recorded how it ended
    if isinstance(number, bool) or not isinstance(number, int) or not 0 < number <= before:
        return None
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int) or memory <= 0):
        return None
    return value


def load(state_store: Any, try_number: int) -> list[dict[str, Any]]:
    """The history of the task instance's earlier tries (empty for the first, or without a store).

    :param state_store: ``context["task_state_store"]`` (``None`` before Airflow 3.3)
    :param try_number: this try's number: entries of later tries are not history (this try's own are: the runs of
        it that an infrastructure failure rescheduled)
    """
    if state_store is None:
        if try_number > 1:
            log.warning("[gpu] no task state store (Airflow < 3.3): this try cannot know how the earlier ones ended")
        return []
    stored = state_store.get(KEY, default=None)
    entries = stored if isinstance(stored, list) else []
    history = [entry for entry in (_entry(value, try_number) for value in entries[:MAX_ENTRIES]) if entry]
    if len(history) != len(entries):
        log.warning("[gpu] %d entries of the OOM history are not the provider's and were ignored", len(entries))
    return history


def save(state_store: Any, history: Sequence[Mapping[str, Any]]) -> None:
    """Keep the history for the next try, wherever it runs, for as long as the DAG run lasts."""
    if state_store is None:
        return
    try:
        from airflow.sdk.execution_time.context import NEVER_EXPIRE  # airflow.sdk.NEVER_EXPIRE, where it is defined
    except ImportError:  # an Airflow whose store has no such retention: its default (docs/resilience.md)
        state_store.set(KEY, [dict(entry) for entry in history])
    else:
        state_store.set(KEY, [dict(entry) for entry in history], retention=NEVER_EXPIRE)


def forget(state_store: Any) -> None:
    """The task succeeded: its history is no longer needed."""
    if state_store is not None:
        state_store.delete(KEY)
