"""A pytest plugin (loaded by tests/conftest.py): the failure matrix's cells, printed as one table at the end.

With ``AIRFLOW_GPU_RELIABILITY_REPORT=<file>`` (``make reliability``), the table is also written to that file.
"""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path

import pytest
from reliability.matrix import BACKENDS, SCENARIOS, Cell, table

_RESULTS: list[Cell] = []
REPORT_HEADER = """# Reliability: the failure matrix

Every backend through every way a task can end (`tests/reliability/`), and what each one left behind: processes,
containers, held GPU locks, task folders and temp dirs, images (a failed or killed build's steps), Ray jobs, actors and
placement groups. Every count must be 0. Only each cell's own are counted (`leftovers.py`: the cell's token in its
processes' environment, its workers' identities on the provider's containers, images and Ray jobs, its labels and
folders; a process that clears its environment is named by its scenario), so the matrix holds while other cells and
other provider tasks run on the same host. Local and Docker cells run a real Airflow worker (`dag.test()`) on a host
with two configured GPUs (no NVIDIA runtime here: Docker tasks fall back to the CPU, after the allocator handed them a
GPU); Kubernetes cells run the rendered pod's containers in Docker; Ray cells run a job on a two-node Ray cluster.
`escaped child`: the task's child leaves its process group, closes its descriptors, ignores SIGTERM and clears its
environment. `worker SIGKILL in image build`: the worker is killed while its derived image's requirements install
from a password-protected index, then the task runs again. The cells run in three lanes side by side (`lanes.py`:
one local or Kubernetes, one Docker and one Ray cell at a time), so `seconds`, a cell's own wall time, is measured
while two other cells run. Regenerate with `make reliability`.

"""


@pytest.fixture(scope="session")
def matrix_results() -> list[Cell]:
    return _RESULTS


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _RESULTS:
        return
    text = table(sorted(_RESULTS, key=_order))
    terminalreporter.write_sep("=", "failure matrix")
    terminalreporter.write_line(text)
    report = os.environ.get("AIRFLOW_GPU_RELIABILITY_REPORT")
    if report:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        where = f"Last run: {stamp}, {platform.system()} {platform.machine()}, Python {platform.python_version()}.\n\n"
        Path(report).write_text(REPORT_HEADER + where + text + "\n")
        terminalreporter.write_line(f"written to {report}")


def _order(cell: Cell) -> tuple[int, int]:
    return list(SCENARIOS).index(cell.scenario), BACKENDS.index(cell.backend)
