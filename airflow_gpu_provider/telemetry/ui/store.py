"""Reading profiles from Airflow's metadata database (XCom rows with key ``gpu_profile``), in the caller's session.

Values are decoded as Airflow's own XCom API decodes them (:meth:`XComModel.deserialize_value`: a JSON string, or
JSON the database already decoded). A custom XCom backend that keeps values elsewhere is not followed.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from airflow.models.taskinstance import TaskInstance
from airflow.models.xcom import XComModel
from sqlalchemy import select

from airflow_gpu_provider.telemetry import XCOM_KEY
from airflow_gpu_provider.telemetry.profile import Profile
from airflow_gpu_provider.telemetry.ui.format import ProfileRow, TaskKey

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

RECENT_LIMIT = 200
#: The operators that push a profile. Any task may push an XCom under ``gpu_profile``: the pages read only those of
#: GPU tasks (rule T2 of docs/security.md, which says what a task's own code can still do).
GPU_OPERATORS = ("GpuStepOperator", "AccelerateOperator", "_GpuDecoratedOperator", "_AccelerateDecoratedOperator")
GPU_DECORATOR = "@task.gpu"


def _of_gpu_tasks() -> Any:
    """The join with the task instance whose operator is a GPU one."""
    return (
        (TaskInstance.dag_id == XComModel.dag_id)
        & (TaskInstance.run_id == XComModel.run_id)
        & (TaskInstance.task_id == XComModel.task_id)
        & (TaskInstance.map_index == XComModel.map_index)
        & (TaskInstance.operator.in_(GPU_OPERATORS) | (TaskInstance.custom_operator_name == GPU_DECORATOR))
    )


def task_profile(session: Session, key: TaskKey) -> Profile | None:
    """The profile of a task instance's latest try, or None."""
    row = session.execute(
        select(XComModel.value)
        .join(TaskInstance, _of_gpu_tasks())
        .where(
            XComModel.dag_id == key.dag_id,
            XComModel.run_id == key.run_id,
            XComModel.task_id == key.task_id,
            XComModel.map_index == key.map_index,
            XComModel.key == XCOM_KEY,
        )
        .limit(1)
    ).first()
    return None if row is None else Profile.read(XComModel.deserialize_value(row))


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
            found.append(ProfileRow(TaskKey(row.dag_id, row.run_id, row.task_id, row.map_index), stored, profile))
    return found
