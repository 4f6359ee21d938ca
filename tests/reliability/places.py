"""Where a cell of the failure matrix runs, and its workers: real Airflow workers (``worker.py``) in a place of its own.

A cell's place is a fresh state dir with two configured GPUs, a copy of the tests' Airflow DB (its workers write to
that one only), its leftovers' :class:`~reliability.leftovers.Scope` (token, temp folder, named pids) and the
workers' environment. A worker parses only its own DAG: the DAG file defines just the one named in
``AIRFLOW_GPU_MATRIX_DAG``, and the workers' one DAG bundle is the DAG file's own folder (``dag.test()`` parses its
DAG's bundle on every run: the whole tests/dags folder cost each worker seconds).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
DAGS = TESTS / "dags" / "reliability"  # the matrix's DAG file, alone in its folder
sys.path.insert(0, str(DAGS))

from helpers import database_copy  # noqa: E402
from reliability.leftovers import DEVICES, RUN_VARIABLE, Scope  # noqa: E402
from reliability_dags import DAG_VARIABLE, PIDS_VARIABLE, RAY_VARIABLE, dag_id  # noqa: E402

WORKER_TIMEOUT = 240
#: what a scenario's function prints once it runs (then it sleeps): the matrix interrupts its worker after that
IN_FUNCTION = b"sleeping"
#: the workers' one DAG bundle
BUNDLE = [{"name": "reliability", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
           "kwargs": {"path": str(DAGS)}}]  # fmt: skip


@dataclass
class Setup:
    """What every cell shares: a work folder, the workers' environment, the tests' Airflow DB, the Ray cluster.

    :param environment: the workers' environment, read once (cells run in threads: ``os.environ`` stays unread)
    :param database: the tests' migrated SQLite DB, which each cell gets a copy of
    :param ray_address: the Jobs API of the tests' Ray cluster, once it runs (what the Ray cells need)
    :param ray_connection: its ``ray_default`` connection (``AIRFLOW_CONN_RAY_DEFAULT``, with the cluster's token)
    :param slurm_conf: the tests' Slurm cluster's ``slurm.conf``, once it runs (what the Slurm cells need)
    :param slurm_environment: its ``slurm_default`` connection (the submit host's)
    """

    work: Path
    environment: dict[str, str]
    database: Path
    ray_address: str = ""
    ray_connection: str = ""
    slurm_conf: str = ""
    slurm_environment: dict[str, str] = field(default_factory=dict)


@dataclass
class Place:
    """Where one cell runs: its leftovers' scope, its state dir and DB, its workers' environment."""

    scope: Scope
    state_dir: Path
    database: Path
    environment: dict[str, str]

    @classmethod
    def of(cls, setup: Setup, backend: str, name: str) -> Place:
        """A fresh place for the cell ``name``: a scope, a state dir and a copy of the DB of its own."""
        ray, slurm = backend == "ray", backend == "slurm"
        scope = Scope(ray_address=setup.ray_address if ray else "", slurm_conf=setup.slurm_conf if slurm else "")
        database = setup.work / f"{name}.db"
        environment = {
            **setup.environment,
            **({RAY_VARIABLE: setup.ray_address, "AIRFLOW_CONN_RAY_DEFAULT": setup.ray_connection} if ray else {}),
            **(setup.slurm_environment if slurm else {}),
            **database_copy(setup.database, database),
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(BUNDLE),
            "AIRFLOW__GPU__DEVICES": ",".join(DEVICES),
            "AIRFLOW__GPU__STATE_DIR": str(setup.work / name),
            "AIRFLOW__GPU__POOL": "",
            RUN_VARIABLE: scope.token,  # every process of the cell inherits it: what the matrix counts
            PIDS_VARIABLE: str(scope.pids),
            "TMPDIR": str(scope.tmp),
        }
        return cls(scope, setup.work / name, database, environment)

    def close(self) -> None:
        """Remove the cell's DB (its workers have ended)."""
        for suffix in ("", "-journal", "-wal", "-shm"):
            self.database.with_name(self.database.name + suffix).unlink(missing_ok=True)


def run_worker(
    place: Place,
    backend: str,
    scenario: str,
    *,
    interrupt: signal.Signals | None = None,
    started: Callable[[], bool] | None = None,
    environment: dict[str, str] | None = None,
) -> tuple[str, str]:
    """Run one cell's DAG in a worker process; ``interrupt`` it once its task runs. Return (task state, log).

    :param started: whether the worker is where it is to be interrupted (default: the scenario's function said
        :data:`IN_FUNCTION`)
    """
    dag = dag_id(backend, scenario)
    worker = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("worker.py")), dag],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**place.environment, DAG_VARIABLE: dag, **(environment or {})},
    )
    place.scope.add_worker(worker.pid)
    output: list[bytes] = []  # read meanwhile: a worker whose pipe is full would stop before its task starts
    in_function = threading.Event()

    def read() -> None:
        assert worker.stdout is not None
        for line in worker.stdout:
            output.append(line)
            if IN_FUNCTION in line:
                in_function.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if interrupt is not None:
            ready = started or in_function.is_set
            deadline = time.monotonic() + 120
            while not ready() and worker.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            worker.send_signal(interrupt)
        worker.wait(timeout=WORKER_TIMEOUT)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        reader.join(timeout=60)
    log = b"".join(output).decode(errors="replace")
    found = re.findall(r"^MATRIX-STATE (\S+)$", log, flags=re.MULTILINE)
    return (found[-1] if found else f"worker exit {worker.returncode}"), log
