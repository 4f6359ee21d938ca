"""One real run of ``tests/dags/retry_policy_dags.py``, shared by the retry policy's and the metrics' tests.

A worker process runs the DAG with ``dag.test()`` on a host of two listed GPUs whose NVML is the replay of a
recording where GPU 0 reports Xid 79 (``tests/nvml_replay``), with Airflow's ``[metrics]`` sending StatsD to a real
UDP listener here. What it leaves: the worker's log, its result, the datagrams received, the run's task instances
and their history in the tests' Airflow DB.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers import start_worker, worker_result
from nvml_replay import RECORDINGS, built_or_skip, replay_environment

DAG_FILE = Path(__file__).resolve().parent / "dags" / "retry_policy_dags.py"
DAG_ID = "gpu_retry_policy"
GPU0 = "GPU-00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class FailingRun:
    """What the run left: the worker's result (states, return values) and log, and the StatsD lines received."""

    result: dict[str, Any]
    log: str
    statsd: list[str]


class StatsdListener:
    """A StatsD server as far as the test needs one: a UDP socket on a free port that keeps every line it receives."""

    def __init__(self) -> None:
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.socket.bind(("127.0.0.1", 0))
        self.socket.settimeout(0.2)
        self.port = self.socket.getsockname()[1]
        self.lines: list[str] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._receive, daemon=True)
        self.thread.start()

    def _receive(self) -> None:
        while not self.stopping.is_set():
            try:
                datagram = self.socket.recv(65535)
            except TimeoutError:
                continue
            self.lines.extend(datagram.decode(errors="replace").splitlines())

    def stop(self) -> list[str]:
        self.stopping.set()
        self.thread.join(timeout=5)
        self.socket.close()
        return self.lines


_RUNS: dict[str, FailingRun] = {}


def failing_run(tmp_path_factory: Any) -> FailingRun:
    """The run (once per test session): needs the migrated DB of the ``airflow_home`` fixture."""
    if DAG_ID not in _RUNS:
        root = tmp_path_factory.mktemp("failing-tries")
        env = {
            **replay_environment(RECORDINGS / "rtx4090_rtx4080_2gpu_xid79.csv", built_or_skip(root / "nvml")),
            "AIRFLOW__GPU__DEVICES": "0,1",
            "AIRFLOW__GPU__STATE_DIR": str(root / "state"),
            "AIRFLOW__GPU__PROFILE_INTERVAL": "0.25",  # the floor
            "AIRFLOW__METRICS__STATSD_ON": "True",
            "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
            "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True",  # the tags, in the line (plain StatsD has none)
        }
        listener = StatsdListener()
        try:
            worker = start_worker(DAG_FILE, DAG_ID, env={**env, "AIRFLOW__METRICS__STATSD_PORT": str(listener.port)})
            try:
                out, _ = worker.communicate(timeout=600)
            finally:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
        finally:
            lines = listener.stop()
        _RUNS[DAG_ID] = FailingRun(worker_result(out), out, lines)
    return _RUNS[DAG_ID]


def task_instances(task_id: str) -> list[Any]:
    """Every try of ``task_id`` in the latest run of the DAG, as Airflow stores it: the history, then the current."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskinstancehistory import TaskInstanceHistory
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        run_id = session.scalar(
            select(DagRun.run_id).where(DagRun.dag_id == DAG_ID).order_by(DagRun.id.desc()).limit(1)
        )
        where = {"dag_id": DAG_ID, "run_id": run_id, "task_id": task_id}
        history = session.scalars(
            select(TaskInstanceHistory).filter_by(**where).order_by(TaskInstanceHistory.try_number)
        )
        tries = [(row.try_number, row.state, row.retry_reason) for row in history]
        current = session.scalars(select(TaskInstance).filter_by(**where)).one()
        return [*tries, (current.try_number, current.state, current.retry_reason)]


def stored_profile(task_id: str, try_number: int) -> dict[str, Any]:
    """The profile of one try, as the provider kept it in the task instance's task state store."""
    import json

    from airflow.models.dagrun import DagRun
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    from airflow_gpu_provider.telemetry.report import try_key

    with create_session() as session:
        run_id = session.scalar(
            select(DagRun.run_id).where(DagRun.dag_id == DAG_ID).order_by(DagRun.id.desc()).limit(1)
        )
        value = session.scalar(
            select(TaskStateStoreModel.value).filter_by(
                dag_id=DAG_ID, run_id=run_id, task_id=task_id, key=try_key(try_number)
            )
        )
    return json.loads(value)
