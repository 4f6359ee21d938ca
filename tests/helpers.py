"""Helpers for running real DAGs in tests."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def dag_bag(path: str | Path) -> Any:
    """A real DagBag of a DAG file or folder (``airflow.models.dagbag`` before Airflow 3.2: the smoke run's too)."""
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:
        from airflow.models.dagbag import DagBag

    return DagBag(dag_folder=str(path))


def database_copy(source: Path, target: Path) -> dict[str, str]:
    """A copy of a migrated SQLite metadata DB for one worker, and the variable that points a worker at it.

    Two Airflow workers of a deployment never share a SQLite file (each takes turns for its write lock, and one gives
    up after SQLite's busy timeout): workers that run side by side in a test each get a copy.
    """
    import sqlite3

    original, copy = sqlite3.connect(source), sqlite3.connect(target)
    try:
        original.backup(copy)
    finally:
        original.close()
        copy.close()
    return {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{target}"}


def load_dag(path: str | Path, dag_id: str) -> Any:
    """Parse one DAG file with a real DagBag and return one of its DAGs (no import errors allowed)."""
    bag = dag_bag(path)
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


DAG_MARK = "WORKER-DAG"  # begins the log of each DAG of a worker that runs several
_WORKER = """
import datetime, json, sys
sys.path.insert(0, {tests!r})
from helpers import load_dag, run_dag, task_states, xcom
date = datetime.datetime.fromisoformat({date!r}) if {date!r} else None
for dag_id in {dag_ids!r}:
    if len({dag_ids!r}) > 1:
        print("WORKER-DAG", dag_id, flush=True)  # DAG_MARK
    dag_run = run_dag(load_dag({dag_file!r}, dag_id), conf={conf!r}, logical_date=date)
    states = task_states(dag_run)
    print("WORKER-RESULT", json.dumps({{"states": states, "xcom": {{t: xcom(dag_run, t) for t in states}}}}), flush=True)
"""


def start_worker(
    dag_file: Any,
    dag_id: str | tuple[str, ...],
    *,
    conf: dict[str, Any] | None = None,
    logical_date: str = "",
    env: Any = None,
) -> Any:
    """A worker process that runs one DAG with ``dag.test()`` and prints its task log (read it from stdout).

    Its last line is ``WORKER-RESULT {"states": ..., "xcom": ...}`` (:func:`worker_result`). Several DAGs (a tuple)
    run one after the other in the one process (it starts in seconds): :func:`worker_results` splits the log.
    """
    import os
    import subprocess
    import sys
    from pathlib import Path

    dag_ids = (dag_id,) if isinstance(dag_id, str) else dag_id
    code = _WORKER.format(
        tests=str(Path(__file__).parent), dag_file=str(dag_file), dag_ids=dag_ids, conf=conf, date=logical_date
    )
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def worker_result(log: str) -> dict[str, Any]:
    """The states and return values a worker of :func:`start_worker` printed (empty when it printed none)."""
    import json

    lines = [line for line in log.splitlines() if line.startswith("WORKER-RESULT ")]
    return json.loads(lines[-1].split(" ", 1)[1]) if lines else {}


def worker_results(log: str) -> dict[str, tuple[dict[str, Any], str]]:
    """Each DAG's result and log, by DAG id, from a worker of :func:`start_worker` that ran several DAGs."""
    sections = f"\n{log}".split(f"\n{DAG_MARK} ")[1:]
    return {section.split("\n", 1)[0]: (worker_result(section), section) for section in sections}


def fuzz_cases(deep: int) -> int:
    """A fuzz test's number of generated cases: ``deep`` under ``make fuzz`` (``HYPOTHESIS_PROFILE=deep``), a tenth
    of it in ``make test`` (the same derandomised cases every run); ``FUZZ_CASES`` sets it outright."""
    if os.environ.get("FUZZ_CASES"):
        return int(os.environ["FUZZ_CASES"])
    return deep if os.environ.get("HYPOTHESIS_PROFILE") == "deep" else max(50, deep // 10)
