"""Reading profiles from Airflow's metadata database, in the caller's session.

The latest try's profile is an XCom row (key ``gpu_profile``); every try's is a task state store row of its task
instance (``airflow_gpu_provider.gpu_profile.try_N``, Airflow 3.3 and later); the tries themselves are the task
instance and its history (``task_instance_history``). XCom values are decoded as Airflow's own XCom API decodes them
(:meth:`XComModel.deserialize_value`: a JSON string, or JSON the database already decoded); task state store values
are JSON text. A custom XCom or state store backend that keeps values elsewhere is not followed.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from airflow.models.taskinstance import TaskInstance
from airflow.models.taskinstancehistory import TaskInstanceHistory
from airflow.models.xcom import XComModel
from sqlalchemy import select

from airflow_gpu_provider.escalation import store as escalation_store
from airflow_gpu_provider.escalation.tries import XCOM_KEY as ESCALATION_KEY
from airflow_gpu_provider.telemetry import TRY_KEY_PREFIX, XCOM_KEY
from airflow_gpu_provider.telemetry.profile import Profile
from airflow_gpu_provider.telemetry.ui.format import ProfileRow, TaskKey, TaskTry

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

RECENT_LIMIT = 200
#: The operators that push a profile. Any task may push an XCom under ``gpu_profile``: the pages read only those of
#: GPU tasks (rule T2 of docs/security.md, which says what a task's own code can still do).
GPU_OPERATORS = ("GpuStepOperator", "AccelerateOperator", "_GpuDecoratedOperator", "_AccelerateDecoratedOperator")
GPU_DECORATOR = "@task.gpu"
_GPU_TASK = TaskInstance.operator.in_(GPU_OPERATORS) | (TaskInstance.custom_operator_name == GPU_DECORATOR)


def _of_gpu_tasks() -> Any:
    """The join with the task instance whose operator is a GPU one."""
    return (
        (TaskInstance.dag_id == XComModel.dag_id)
        & (TaskInstance.run_id == XComModel.run_id)
        & (TaskInstance.task_id == XComModel.task_id)
        & (TaskInstance.map_index == XComModel.map_index)
        & _GPU_TASK
    )


def _xcom(session: Session, key: TaskKey, xcom_key: str) -> Any:
    """A GPU task instance's XCom value under ``xcom_key``, decoded, or None."""
    row = session.execute(
        select(XComModel.value)
        .join(TaskInstance, _of_gpu_tasks())
        .where(
            XComModel.dag_id == key.dag_id,
            XComModel.run_id == key.run_id,
            XComModel.task_id == key.task_id,
            XComModel.map_index == key.map_index,
            XComModel.key == xcom_key,
        )
        .limit(1)
    ).first()
    return None if row is None else XComModel.deserialize_value(row)


def task_profile(session: Session, key: TaskKey) -> Profile | None:
    """The profile of a task instance's latest try, or None."""
    return Profile.read(_xcom(session, key, XCOM_KEY))


def _where(model: Any, key: TaskKey) -> tuple[Any, ...]:
    return (
        model.dag_id == key.dag_id,
        model.run_id == key.run_id,
        model.task_id == key.task_id,
        model.map_index == key.map_index,
    )


def _stored(session: Session, key: TaskKey, prefix: str) -> dict[str, Any]:
    """The task instance's task state store values whose key starts with ``prefix``, decoded ({} before 3.3)."""
    try:
        from airflow.models.task_state_store import TaskStateStoreModel
    except ImportError:  # Airflow < 3.3
        return {}
    rows = session.execute(
        select(TaskStateStoreModel.key, TaskStateStoreModel.value).where(
            *_where(TaskStateStoreModel, key), TaskStateStoreModel.key.startswith(prefix, autoescape=True)
        )
    ).all()
    found = {}
    for name, value in rows:
        try:
            found[name] = json.loads(value)
        except (TypeError, ValueError):
            continue
    return found


def task_tries(session: Session, key: TaskKey) -> list[TaskTry]:
    """Every try of a GPU task instance, oldest first, each with its profile where one was stored.

    A try's profile is its task state store row; the latest try's is also (and, before Airflow 3.3 or with
    ``[state_store] clear_on_success``, only) its XCom. A profile counts for a try only when it says it is that
    try's. Empty for a task instance that is not a GPU task's, or that has not run.
    """
    columns = ("try_number", "state", "start_date", "end_date", "hostname")
    current = session.execute(
        select(*(getattr(TaskInstance, c) for c in columns)).where(*_where(TaskInstance, key), _GPU_TASK)
    ).first()
    if current is None:
        return []
    history = session.execute(
        select(*(getattr(TaskInstanceHistory, c) for c in columns)).where(*_where(TaskInstanceHistory, key))
    ).all()
    profiles: dict[int, Profile] = {}
    for name, value in _stored(session, key, TRY_KEY_PREFIX).items():
        profile = Profile.read(value)
        if profile is not None and name == f"{TRY_KEY_PREFIX}{profile.try_number}":
            profiles[profile.try_number] = profile  # type: ignore[index]  # try_number is set: the key matched
    latest = task_profile(session, key)
    if latest is not None and latest.try_number is not None:
        profiles.setdefault(latest.try_number, latest)
    tries = {row.try_number: row for row in (*history, current) if row.try_number and row.try_number > 0}
    numbers = sorted(set(tries) | set(profiles))
    return [
        TaskTry(
            number,
            str(tries[number].state or "none") if number in tries else None,
            _epoch(tries[number].start_date) if number in tries else None,
            _epoch(tries[number].end_date) if number in tries else None,
            str(tries[number].hostname or "") if number in tries else "",
            profiles.get(number),
        )
        for number in numbers
    ]


def _epoch(moment: Any) -> float | None:
    return None if moment is None else float(moment.timestamp())


def escalation_history(session: Session, key: TaskKey) -> tuple[str, list[dict[str, Any]]]:
    """The ``on_oom`` ladder and history of a GPU task instance's tries (``("", [])`` without one).

    From the latest try's XCom, else from what the task state store keeps for the next try (while a retry runs,
    Airflow has cleared the XCom). The entries are dicts: check each field as it is read.
    """
    pushed = _xcom(session, key, ESCALATION_KEY)
    entries = pushed.get("tries") if isinstance(pushed, dict) else None
    gpu_task = session.execute(select(TaskInstance.try_number).where(*_where(TaskInstance, key), _GPU_TASK)).first()
    if entries is None and gpu_task is not None:
        entries = _stored(session, key, escalation_store.KEY).get(escalation_store.KEY)
    ladder = pushed.get("on_oom") if isinstance(pushed, dict) else None
    kept = [entry for entry in entries if isinstance(entry, dict)][:100] if isinstance(entries, list) else []
    return (ladder[:300] if isinstance(ladder, str) else ""), kept


def task_state(session: Session, key: TaskKey) -> str | None:
    """The task instance's state (``"none"`` when it has none yet), or None when there is no such instance."""
    row = session.execute(
        select(TaskInstance.state).where(
            TaskInstance.dag_id == key.dag_id,
            TaskInstance.run_id == key.run_id,
            TaskInstance.task_id == key.task_id,
            TaskInstance.map_index == key.map_index,
        )
    ).first()
    return None if row is None else str(row.state or "none")


def profiled_dags(session: Session, dag_ids: Collection[str]) -> list[str]:
    """Which of ``dag_ids`` have a GPU task whose latest try stored a profile (the GPUs page's DAG filter)."""
    if not dag_ids:
        return []
    query = (
        select(XComModel.dag_id)
        .join(TaskInstance, _of_gpu_tasks())
        .where(XComModel.key == XCOM_KEY, XComModel.dag_id.in_(sorted(dag_ids)))
        .distinct()
    )
    return sorted(session.scalars(query))


def recent_profiles(session: Session, dag_ids: Collection[str], limit: int = RECENT_LIMIT) -> list[ProfileRow]:
    """The newest ``limit`` profiles of the DAGs ``dag_ids``, newest first (rows that are no profile skipped)."""
    if not dag_ids:
        return []
    rows = session.execute(
        select(
            XComModel.dag_id,
            XComModel.run_id,
            XComModel.task_id,
            XComModel.map_index,
            XComModel.timestamp,
            XComModel.value,
            TaskInstance.state,
            TaskInstance.try_number,
        )
        .join(TaskInstance, _of_gpu_tasks())
        .where(XComModel.key == XCOM_KEY, XComModel.dag_id.in_(sorted(dag_ids)))
        .order_by(XComModel.timestamp.desc())
        .limit(limit)
    ).all()
    found = []
    for row in rows:
        profile = Profile.read(XComModel.deserialize_value(row))
        if profile is not None:
            stored = row.timestamp.timestamp() if row.timestamp is not None else 0.0
            state = ProfileRow.try_state(row.state and str(row.state), row.try_number, profile.try_number)
            found.append(
                ProfileRow(TaskKey(row.dag_id, row.run_id, row.task_id, row.map_index), stored, profile, state)
            )
    return found
