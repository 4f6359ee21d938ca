"""One Airflow worker of the failure matrix: runs one DAG of tests/dags/reliability/ with ``dag.test()``.

The real task runner runs the task in this process (execution_timeout, and on_kill from SIGTERM, included). The
last line printed is ``MATRIX-STATE <state of the task>``. The matrix names the DAG in ``AIRFLOW_GPU_MATRIX_DAG``
too, so that the file defines only that one.
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from helpers import load_dag, run_dag, task_states  # noqa: E402

if __name__ == "__main__":
    dag_run = run_dag(load_dag(TESTS / "dags" / "reliability" / "reliability_dags.py", sys.argv[1]))
    print(f"MATRIX-STATE {task_states(dag_run)['task']}", flush=True)
    # The run is over: what a normal exit runs (atexit), then no interpreter teardown, which takes ~3 s of a loaded
    # machine (freeing every module's objects) and does nothing for the task or its leftovers.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
