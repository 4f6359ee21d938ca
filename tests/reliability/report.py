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

Every backend through every way a task can end (`tests/reliability/`), and what each left behind: processes,
containers, held GPU locks, task folders and temp dirs, images (a failed or killed build's steps), Ray jobs, actors and
placement groups, Slurm jobs and job folders. A cell says `ok` and its wall time when the task ended as its row says,
its log shows the evidence (`matrix.py` `EXPECTED`) and it left nothing; else what went wrong. Only each cell's own
are counted (`leftovers.py`: its token in its processes' environment, its workers' identities on containers, images
and jobs, its labels and folders), so the matrix holds while other cells and tasks run on the same host. Local and
Docker cells run a real Airflow worker (`dag.test()`) on a host with two configured GPUs (no NVIDIA runtime here:
Docker tasks fall back to the CPU after the allocator handed them a GPU); Kubernetes cells run the rendered pod's
containers in Docker; Ray cells a job on a two-node Ray cluster; Slurm cells a batch job on a two-node Slurm cluster.
`escaped child`: the task's child leaves its process group, closes its descriptors, ignores SIGTERM and clears its
environment. `worker SIGKILL in image build`: the worker is killed while its derived image's requirements install
from a password-protected index, then the task runs again. The cells run in lanes side by side (`lanes.py`: one
local or Kubernetes, one Docker, one Ray and one Slurm cell at a time), so a cell's time is measured while others
run. Regenerate with `make reliability`.

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
