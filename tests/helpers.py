"""Helpers for running real DAGs in tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_dag(path: str | Path, dag_id: str) -> Any:
    """Parse one DAG file with a real DagBag and return one of its DAGs (no import errors allowed)."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(path))
    assert bag.import_errors == {}, bag.import_errors
    return bag.get_dag(dag_id)


def run_dag(dag: Any, conf: dict[str, Any] | None = None, logical_date: Any = None) -> Any:
    """Run a DAG with ``dag.test()`` (real task runner, real SQLite DB) and return the DagRun.

    :param logical_date: the run's logical date: the same date again reruns the same DAG run (its task instances
        cleared, their next try), as a retry on another worker would
    """
    if logical_date is not None:
        return dag.test(run_conf=conf, logical_date=logical_date)
    return dag.test(run_conf=conf)


def task_states(dag_run: Any) -> dict[str, str]:
    """``{task_id: state}`` of a finished run (map index -1 only)."""
    from airflow.utils.session import create_session

    with create_session() as session:
        return {ti.task_id: str(ti.state) for ti in dag_run.get_task_instances(session=session) if ti.map_index < 1}


def xcom(dag_run: Any, task_id: str, key: str = "return_value") -> Any:
    """The XCom value a task of a finished run pushed."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(
            XComModel.get_many(run_id=dag_run.run_id, dag_ids=dag_run.dag_id, task_ids=task_id, key=key)
        ).first()
        return None if row is None else XComModel.deserialize_value(row)


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie does not)."""
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def mapped_xcoms(dag_run: Any, task_id: str, key: str = "return_value") -> dict[int, Any]:
    """``{map_index: value}`` of a mapped task of a finished run."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.scalars(
            XComModel.get_many(
                run_id=dag_run.run_id, dag_ids=dag_run.dag_id, task_ids=task_id, key=key, map_indexes=None
            )
        ).all()
        return {row.map_index: XComModel.deserialize_value(row) for row in rows}
