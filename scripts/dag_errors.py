"""After a failed ``make dags-test``: the DAG file's import errors, printed last, where the eye lands.

``airflow dags test`` prints a DAG file's import error and then ~30 lines of its own traceback ending in "Dag ...
could not be found". This parses the file again, as Airflow does (a DagBag), and prints only what is wrong with it:
its import errors (the provider's name the file, the line and the task), or the DAG ids it does define when the one
asked for is not among them. Nothing is printed when the file parsed and had that DAG (a task failed: its log says
why). Usage: ``python scripts/dag_errors.py DAG_FILE DAG_ID``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from redirect import output_to


def main(dag_file: str, dag_id: str) -> int:
    """Print what kept ``dag_id`` from running out of ``dag_file``; 1 if something did, else 0."""
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # before Airflow 3.2
        from airflow.models.dagbag import DagBag  # type: ignore[no-redef]

    logging.disable(logging.CRITICAL)  # the DagBag logs the error as well: once is enough
    with output_to(Path("/dev/null")):
        bag = DagBag(dag_folder=dag_file)
    if bag.import_errors:
        for path, error in bag.import_errors.items():
            print(f"\nImport error of {path}:\n{error.rstrip()}", file=sys.stderr)
        return 1
    if dag_id not in bag.dag_ids:
        defined = ", ".join(sorted(bag.dag_ids)) or "none"
        print(f"\n{dag_file} has no DAG {dag_id!r}; the DAGs it defines: {defined}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
