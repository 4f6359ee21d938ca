"""One Airflow worker of the failure matrix: runs one DAG of tests/dags/reliability_dags.py with ``dag.test()``.

The real task runner runs the task in this process (execution_timeout, and on_kill from SIGTERM, included). The
last line printed is ``MATRIX-STATE <state of the task>``.
"""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from helpers import load_dag, run_dag, task_states  # noqa: E402

if __name__ == "__main__":
    dag_run = run_dag(load_dag(TESTS / "dags" / "reliability_dags.py", sys.argv[1]))
    print(f"MATRIX-STATE {task_states(dag_run)['task']}", flush=True)
