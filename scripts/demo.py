"""Run the demo DAG end to end on the local backend and print a short report: its result, or why it failed.

Used by ``make demo``; expects AIRFLOW_HOME (with a migrated DB) and the dags folder in the environment. Airflow's
own log and the task logs go to ``$AIRFLOW_HOME/demo.log`` (its path is printed); the screen gets the outcome: the
tasks' states, the train task's profile and the result, or each failed task's error.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from redirect import output_to  # scripts/, this script's folder

REPO = Path(__file__).resolve().parents[1]
DAG_FILE, DAG_ID = "gpu_training_demo.py", "gpu_training_demo"
RECORD = re.compile(r"^\d{4}-\d\d-\d\dT[\d:.]+Z \[")  # a log record starts with its timestamp and level
STARTING = re.compile(r"\[DAG TEST\] starting task_id=(\S+)")


def run_example(file_name: str, dag_id: str, conf: dict[str, Any]) -> Any:
    """Run an example DAG of dags/ with ``dag.test()``; return its DagRun.

    :raises RuntimeError: when the file does not parse (the message holds Airflow's import errors)
    """
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # before Airflow 3.2
        from airflow.models.dagbag import DagBag  # type: ignore[no-redef]

    bag = DagBag(dag_folder=str(REPO / "dags" / file_name))
    if bag.import_errors:
        raise RuntimeError("\n".join(bag.import_errors.values()))
    return bag.get_dag(dag_id).test(run_conf=conf)


def task_states(dag_run: Any) -> dict[str, str]:
    """``{task_id: state}`` of a finished run, in the order the tasks started (those that never did last)."""
    from airflow.utils.session import create_session

    with create_session() as session:
        instances = dag_run.get_task_instances(session=session)
        started = sorted(instances, key=lambda ti: (ti.start_date is None, ti.start_date or 0, ti.task_id))
        return {ti.task_id: str(ti.state) for ti in started}


def xcom(dag_run: Any, task_id: str, key: str = "return_value") -> Any:
    """The XCom value ``key`` of ``task_id`` in ``dag_run``, or ``None``."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.scalars(
            XComModel.get_many(run_id=dag_run.run_id, dag_ids=dag_run.dag_id, task_ids=task_id, key=key)
        ).all()
        return XComModel.deserialize_value(rows[0]) if rows else None


def failure_reasons(log: str) -> dict[str, str]:
    """``{task_id: its error}`` from a ``dag.test()`` log: the last line of each "Task failed" traceback."""
    reasons = {}
    parts = STARTING.split(log)  # [before, task_id, its log, task_id, its log, ...]
    for task_id, text in zip(parts[1::2], parts[2::2], strict=True):
        _, failed, after = text.partition("Task failed with exception")
        if not failed:
            continue
        lines = []
        for line in after.splitlines()[1:]:
            if RECORD.match(line):
                break
            lines.append(line)
        last = next((line for line in reversed(lines) if line.strip()), "")
        reasons[task_id] = re.sub(r"^[\w.]+\.(\w+): ", r"\1: ", last.strip())  # the exception's class by its name
    return reasons


def main() -> int:
    """Run the DAG quietly, print the outcome; exit 1 unless the run succeeded."""
    from airflow_gpu_provider.telemetry import XCOM_KEY
    from airflow_gpu_provider.telemetry.profile import Profile
    from airflow_gpu_provider.telemetry.report import summary_lines

    conf = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    log_path = Path(os.environ["AIRFLOW_HOME"]) / "demo.log"
    print(f"Running dags/{DAG_FILE} with {json.dumps(conf)} (Airflow's log and the task logs: {log_path})")
    started = time.monotonic()
    try:
        with output_to(log_path):
            dag_run = run_example(DAG_FILE, DAG_ID, conf)
    except RuntimeError as err:
        print(f"{DAG_FILE} did not parse:\n{err}")
        return 1
    states = task_states(dag_run)
    state = str(dag_run.state)
    took = time.monotonic() - started
    print(f"{DAG_ID}: {state} in {took:.0f}s ({', '.join(f'{task} {s}' for task, s in states.items())})")
    if state != "success":
        reasons = failure_reasons(log_path.read_text(errors="replace"))
        for task, task_state in states.items():
            if task_state == "failed":
                print(f"{task} failed: {reasons.get(task, 'see the log')}")
        print(f"The whole log: {log_path}")
        return 1
    profile = Profile.read(xcom(dag_run, "train", XCOM_KEY) or {})
    if profile is not None:
        print("\n".join(f"train's {line}" if i == 0 else line for i, line in enumerate(summary_lines(profile))))
    print(f"result (the report task's XCom): {json.dumps(xcom(dag_run, 'report'), indent=2)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
