"""Run the demo DAG end to end on the embedded local backend and print its result.

Used by ``make demo``; expects AIRFLOW_HOME (with a migrated DB) and the dags folder in the environment.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    """Run the DAG, print the report task's XCom; exit 1 unless the run succeeded."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    conf = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    bag = DagBag(dag_folder=str(REPO / "dags" / "gpu_training_demo.py"))
    if bag.import_errors:
        print(json.dumps(bag.import_errors, indent=2), file=sys.stderr)
        return 1
    dag_run = bag.get_dag("gpu_training_demo").test(run_conf=conf)
    with create_session() as session:
        rows = session.scalars(
            XComModel.get_many(run_id=dag_run.run_id, dag_ids=dag_run.dag_id, task_ids="report", key="return_value")
        ).all()
        result = XComModel.deserialize_value(rows[0]) if rows else None
    print("\n=== gpu_training_demo result ===")
    print(json.dumps({"state": str(dag_run.state), "run_id": dag_run.run_id, "metrics": result}, indent=2))
    return 0 if str(dag_run.state) == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
