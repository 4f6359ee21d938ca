"""A real Airflow of separate processes for the executor tests: Redis, API server, scheduler, DAG processor, workers.

Each process runs in its own session with the cluster's AIRFLOW_HOME and free ports; :meth:`Cluster.stop` stops
every one (SIGTERM to its group, SIGKILL after a grace, then any descendant that left the group), so nothing outlives
the test. The metadata DB is SQLite: in Airflow 3 workers reach it only through the API server.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import database_copy
from local_airflow import free_port

AIRFLOW = [sys.executable, "-m", "airflow"]
STOP_GRACE = 5.0  # then SIGKILL: an edge worker whose API server has gone retries its report until killed
POLL = 0.2  # how often a wait looks at the metadata DB (a read-only SQLite query)
_MIGRATED: list[Path] = []  # a freshly migrated metadata DB, copied for each later cluster of this process


def require(binary: str, package: str) -> str:
    """The path of a system binary; without it, skip (fail in CI, whose .ci/run installs ``package``)."""
    path = shutil.which(binary) or (f"/usr/bin/{binary}" if Path(f"/usr/bin/{binary}").exists() else None)
    if path is None:
        why = f"{binary} is not installed (apt-get install {package}; .ci/run installs it)"
        if os.environ.get("CI", "").lower() in ("1", "true"):
            pytest.fail(f"CI: {why}", pytrace=False)
        pytest.skip(why)
    return path


class Cluster:
    """Processes sharing one AIRFLOW_HOME and configuration."""

    def __init__(self, home: Path, dags: Path, config: dict[str, str]) -> None:
        self.home = home
        self.api_port = free_port()
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(
                [
                    {
                        "name": "dags-folder",
                        "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                        "kwargs": {"path": str(dags)},
                    }
                ]
            ),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "2",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__API__PORT": str(self.api_port),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__BASE_URL": f"http://localhost:{self.api_port}",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "AIRFLOW__CORE__FERNET_KEY": "",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__GPU__STATE_DIR": str(home / "gpu-state"),
            **config,
        }
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    # ------------------------------------------------------------------ processes
    def run(self, *args: str) -> str:
        """An ``airflow`` CLI command, to completion."""
        done = subprocess.run([*AIRFLOW, *args], env=self.env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, f"airflow {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    def start(self, name: str, argv: list[str], **environment: str) -> None:
        """Start a long-running process, its output in ``<home>/<name>.log``."""
        with (self.home / f"{name}.log").open("wb") as log:
            self.processes[name] = subprocess.Popen(
                argv, env={**self.env, **environment}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def start_redis(self) -> str:
        """Debian's redis-server on a free port, no persistence; the broker URL."""
        port = free_port()
        binary = require("redis-server", "redis-server")
        self.start("redis", [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        wait_for_port(port, 30, self)
        return f"redis://127.0.0.1:{port}"

    def migrate(self) -> None:
        """A fresh metadata DB: the first cluster of a test process migrates its own; the later ones start from a copy
        of that one (``airflow db migrate`` takes seconds of CPU, and its result is the same for every cluster here)."""
        if _MIGRATED:
            database_copy(_MIGRATED[0], self.home / "airflow.db")
        else:
            self.run("db", "migrate")
            template = Path(tempfile.mkdtemp(prefix="airflow-gpu-migrated-")) / "airflow.db"
            atexit.register(shutil.rmtree, template.parent, ignore_errors=True)
            database_copy(self.home / "airflow.db", template)
            _MIGRATED.append(template)

    def start_airflow(self) -> None:
        """Migrate the DB (:meth:`migrate`), then start the API server, DAG processor and scheduler; wait for the API
        server."""
        self.migrate()
        self.start("api-server", [*AIRFLOW, "api-server", "--port", str(self.api_port), "--host", "127.0.0.1"])
        self.start("dag-processor", [*AIRFLOW, "dag-processor"])
        self.start("scheduler", [*AIRFLOW, "scheduler"])
        wait_for_port(self.api_port, 120, self)

    def stop(self) -> list[str]:
        """Stop every process (SIGTERM to all, workers first, then one grace for all); return those still alive
        afterwards (none expected)."""
        import psutil

        trees: list[psutil.Process] = []
        for name in reversed(list(self.processes)):
            process = self.processes[name]
            with contextlib.suppress(psutil.NoSuchProcess):
                trees += [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.0, deadline - time.monotonic()))
        for process in self.processes.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        _, alive = psutil.wait_procs(trees, timeout=5)
        for survivor in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                survivor.kill()
        for process in self.processes.values():
            process.wait()
        return self.leftovers()

    def leftovers(self) -> list[str]:
        """Live processes started with this cluster's AIRFLOW_HOME."""
        import psutil

        found = []
        for process in psutil.process_iter(["pid", "cmdline", "status"]):
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                if process.info["status"] != psutil.STATUS_ZOMBIE and process.environ().get("AIRFLOW_HOME") == str(
                    self.home
                ):
                    found.append(f"{process.pid} {' '.join(process.info['cmdline'] or [])}")
        return found

    def logs(self, lines: int = 40) -> str:
        """The end of every process's log and of every task log, for failure messages."""
        parts = []
        files = [self.home / f"{name}.log" for name in self.processes]
        for path in [*files, *sorted((self.home / "logs").glob("dag_id=*/**/*.log"))]:
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"----- {path.relative_to(self.home)}\n" + "\n".join(text))
        return "\n".join(parts)

    # ------------------------------------------------------------------ the metadata DB (read only)
    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """Rows of a read-only query on the SQLite metadata DB."""
        with contextlib.closing(
            sqlite3.connect(f"file:{self.home / 'airflow.db'}?mode=ro", uri=True, timeout=30)
        ) as db:
            return db.execute(sql, params).fetchall()

    def wait_for_dag(self, dag_id: str, timeout: float = 120) -> None:
        """Until the DAG processor has serialised ``dag_id``."""
        self._wait(lambda: self.query("SELECT 1 FROM serialized_dag WHERE dag_id = ?", dag_id), timeout, dag_id)

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 150) -> str:
        """Until the run has finished; its state."""

        def finished() -> str | None:
            rows = self.query("SELECT state FROM dag_run WHERE dag_id = ? AND run_id = ?", dag_id, run_id)
            return rows[0][0] if rows and rows[0][0] in ("success", "failed") else None

        return self._wait(finished, timeout, run_id)

    def trigger(self, dag_id: str, run_id: str, conf: dict[str, Any] | None = None) -> None:
        """Unpause ``dag_id`` and trigger a run of it, through the REST API (an ``airflow`` CLI call costs seconds of
        CPU to start)."""
        self.api(f"/api/v2/dags/{dag_id}", {"is_paused": False}, method="PATCH")
        self.api(f"/api/v2/dags/{dag_id}/dagRuns", {"dag_run_id": run_id, "logical_date": None, "conf": conf or {}})

    def trigger_and_wait(self, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
        """Unpause and trigger ``dag_id`` once it is parsed; the task instances of the run, which must succeed."""
        self.wait_for_dag(dag_id)
        self.trigger(dag_id, run_id)
        state = self.wait_for_run(dag_id, run_id)
        tis = self.task_instances(dag_id, run_id)
        assert state == "success", f"{tis}\n{self.logs()}"
        return tis

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
        """``{task_id: {state, queue, pool, executor}}`` of a run."""
        rows = self.query(
            "SELECT task_id, state, queue, pool, executor FROM task_instance WHERE dag_id = ? AND run_id = ?",
            dag_id,
            run_id,
        )
        return {row[0]: dict(zip(("state", "queue", "pool", "executor"), row[1:])) for row in rows}

    def xcom(self, dag_id: str, run_id: str, task_id: str) -> Any:
        """A task's return value."""
        rows = self.query(
            "SELECT value FROM xcom WHERE dag_id = ? AND run_id = ? AND task_id = ? AND key = 'return_value'",
            dag_id,
            run_id,
            task_id,
        )
        value = json.loads(rows[0][0]) if rows else None
        return json.loads(value) if isinstance(value, str) else value

    def api(self, path: str, body: Any = None, method: str | None = None) -> Any:
        """A call of the REST API, as the deployment's user (the simple auth manager's generated password)."""
        import urllib.request

        def call(path: str, body: Any = None, token: str = "", method: str | None = None) -> Any:
            headers = {"Content-Type": "application/json", "Accept": "application/json"}
            request = urllib.request.Request(
                f"http://127.0.0.1:{self.api_port}{path}",
                data=None if body is None else json.dumps(body).encode(),
                headers={**headers, **({"Authorization": f"Bearer {token}"} if token else {})},
                method=method,
            )
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.loads(response.read())

        passwords = json.loads((self.home / "simple_auth_manager_passwords.json.generated").read_text())
        user, password = next(iter(passwords.items()))
        token = call("/auth/token", {"username": user, "password": password})["access_token"]
        return call(path, body, token, method)

    def task_log_records(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> list[dict[str, Any]]:
        """A task's log as the UI shows it: the API server's reader, the worker's and the triggerer's files merged."""
        path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}?full_content=true"
        return [record for record in self.api(path)["content"] if isinstance(record, dict)]

    def _wait(self, probe: Any, timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(sqlite3.OperationalError):
                found = probe()
                if found:
                    return found
            dead = [name for name, p in self.processes.items() if p.poll() is not None]
            assert not dead, f"{dead} exited while waiting for {what}:\n{self.logs()}"
            time.sleep(POLL)
        raise AssertionError(f"timed out waiting for {what}:\n{self.logs()}")


def wait_for_port(port: int, timeout: float, cluster: Cluster) -> None:
    """Until something listens on ``127.0.0.1:port``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        dead = [name for name, p in cluster.processes.items() if p.poll() is not None]
        assert not dead, f"{dead} exited while waiting for port {port}:\n{cluster.logs()}"
        time.sleep(0.5)
    raise AssertionError(f"nothing listens on port {port} after {timeout}s:\n{cluster.logs()}")


@contextlib.contextmanager
def reattach_cluster(tmp_path: Path, root_mode: int = 0o700) -> Iterator[Cluster]:
    """A CeleryExecutor Airflow running ``tests/dags/reattach_dags.py``, without workers yet (:func:`celery_worker`).

    A dead worker's task instance is failed and retried 10 s after its last heartbeat. ``cluster.root`` is the
    checkpoint root the DAG's runs are allowed (``root_mode``: who besides the worker reads it).
    """
    from conftest import REPO

    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(REPO / "tests" / "dags" / "reattach_dags.py", dags)
    home = tmp_path / "home"
    home.mkdir()
    root = Path(tempfile.mkdtemp(prefix="reattach-root-"))
    root.chmod(root_mode)
    cluster = Cluster(
        home,
        dags,
        {
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__GPU__DEVICES": "none",
            "AIRFLOW__GPU_POLICY__ALLOWED_CHECKPOINT_ROOTS": str(root),
            "AIRFLOW__GPU_POLICY__ALLOWED_CLUSTERS": "slurm=slurm_test",  # the Slurm DAG's (the tests' cluster)
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "10",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
        },
    )
    cluster.root = root  # type: ignore[attr-defined]
    try:
        broker = cluster.start_redis()
        cluster.env["AIRFLOW__CELERY__BROKER_URL"] = f"{broker}/0"
        cluster.env["AIRFLOW__CELERY__RESULT_BACKEND"] = f"redis://{broker.split('://')[1]}/1"
        cluster.start_airflow()
        yield cluster
    finally:
        leftovers = cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
        assert leftovers == [], leftovers


def celery_worker(cluster: Cluster, name: str, slots: int = 1) -> None:
    """Start a Celery worker of ``slots`` slots, named ``name``."""
    argv = [*AIRFLOW, "celery", "worker", "--concurrency", str(slots), "--skip-serve-logs"]
    cluster.start(name, [*argv, "--celery-hostname", f"{name}@%h"])


def let_go(root: Path) -> None:
    """End the work of every ``counts_its_runs`` below ``root`` (tests/dags/reattach_dags.py): a file ``go`` beside
    each ``runs.txt``, owned as that file is (the task's user may be another)."""
    for runs in root.glob("**/runs.txt"):
        go = runs.with_name("go")
        go.touch()
        owner = runs.stat()
        os.chown(go, owner.st_uid, owner.st_gid)


def try_log(cluster: Cluster, dag_id: str, try_number: int) -> str:
    """The log of a try of the DAG's task (one task per DAG), or "" before it exists."""
    logs = sorted((cluster.home / "logs").glob(f"dag_id={dag_id}/**/attempt={try_number}.log"))
    return logs[0].read_text(errors="replace") if logs else ""
