"""Run the demo DAG end to end on the embedded local backend and print its result.

Used by ``make demo``; expects AIRFLOW_HOME (with a migrated DB) and the dags folder in the environment.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def run_example(file_name: str, dag_id: str, conf: dict[str, Any]) -> Any:
    """Run an example DAG of dags/ with ``dag.test()``; return its DagRun.

    :raises RuntimeError: when the file does not parse
    """
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags" / file_name))
    if bag.import_errors:
        raise RuntimeError(json.dumps(bag.import_errors, indent=2))
    return bag.get_dag(dag_id).test(run_conf=conf)


def xcom(dag_run: Any, task_id: str, key: str = "return_value") -> Any:
    """The XCom value ``key`` of ``task_id`` in ``dag_run``, or ``None``."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.scalars(
            XComModel.get_many(run_id=dag_run.run_id, dag_ids=dag_run.dag_id, task_ids=task_id, key=key)
        ).all()
        return XComModel.deserialize_value(rows[0]) if rows else None


def main() -> int:
    """Run the DAG, print the report task's XCom and the train task's profile; exit 1 unless the run succeeded."""
    from airflow_gpu_provider.telemetry import XCOM_KEY
    from airflow_gpu_provider.telemetry.profile import Profile
    from airflow_gpu_provider.telemetry.report import summary_lines

    conf = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    try:
        dag_run = run_example("gpu_training_demo.py", "gpu_training_demo", conf)
    except RuntimeError as err:
        print(err, file=sys.stderr)
        return 1
    profile = Profile.read(xcom(dag_run, "train", XCOM_KEY))
    if profile is not None:
        print("\n=== the train task's profile (XCom key gpu_profile) ===")
        print("\n".join(summary_lines(profile)))
    print("\n=== gpu_training_demo result ===")
    result = xcom(dag_run, "report")
    print(json.dumps({"state": str(dag_run.state), "run_id": dag_run.run_id, "metrics": result}, indent=2))
    return 0 if str(dag_run.state) == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
