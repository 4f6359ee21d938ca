"""A real Airflow of separate processes for benchmarks: API server, DAG processor, scheduler (LocalExecutor),
triggerer, in a throw-away AIRFLOW_HOME on SQLite; and a watch on its LocalExecutor worker processes.

Each process runs in a session of its own; :meth:`Airflow.stop` stops every one (SIGTERM to its group, SIGKILL
after a grace), then any process left with this home in its environment (a GPU-lock keeper, a task's child).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AIRFLOW = [sys.executable, "-m", "airflow"]
STOP_GRACE = 20.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Airflow:
    """Scheduler (LocalExecutor), DAG processor, API server and triggerer sharing ``home`` and a DAG folder."""

    def __init__(self, home: Path, dags: Path, config: dict[str, str]) -> None:
        self.home = home
        self.api_port = free_port()
        bundles = [{"name": "dags-folder", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle"}]
        bundles[0]["kwargs"] = {"path": str(dags)}  # type: ignore[assignment]
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundles),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "2",
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

    def run(self, *args: str) -> str:
        """An ``airflow`` CLI command, to completion."""
        done = subprocess.run([*AIRFLOW, *args], check=False, env=self.env, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"airflow {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done.stdout

    def start(self) -> None:
        """Migrate the DB, start every component and wait for the API server."""
        self.run("db", "migrate")
        for name, argv in (
            ("api-server", ["api-server", "--port", str(self.api_port), "--host", "127.0.0.1"]),
            ("dag-processor", ["dag-processor"]),
            ("scheduler", ["scheduler"]),
            ("triggerer", ["triggerer"]),
        ):
            with (self.home / f"{name}.log").open("wb") as log:
                self.processes[name] = subprocess.Popen(
                    [*AIRFLOW, *argv], env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
        self.wait(lambda: _listens(self.api_port), 180, "the API server")

    def stop(self) -> list[str]:
        """Stop every process and what it left; return what could not be stopped (nothing expected)."""
        import psutil

        for process in reversed(list(self.processes.values())):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(deadline - time.monotonic(), 0.1))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        left = self.leftovers()
        for pid in left:
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
        psutil.wait_procs([psutil.Process(pid) for pid in left if psutil.pid_exists(pid)], timeout=5)
        return [str(pid) for pid in self.leftovers()]

    def leftovers(self) -> list[int]:
        """Live processes started with this home (every one of them is ours)."""
        import psutil

        found = []
        for process in psutil.process_iter(["pid", "status"]):
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                if process.info["status"] != psutil.STATUS_ZOMBIE and process.environ().get("AIRFLOW_HOME") == str(
                    self.home
                ):
                    found.append(process.info["pid"])
        return found

    def query(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """Rows of a read-only query on the metadata DB."""
        uri = f"file:{self.home / 'airflow.db'}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=30)) as db:
            return db.execute(sql, params).fetchall()

    def wait(self, probe: Any, timeout: float, what: str, interval: float = 0.5) -> Any:
        """Until ``probe()`` is true (its value); fail when a component exits or after ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(sqlite3.OperationalError):
                found = probe()
                if found:
                    return found
            dead = [name for name, process in self.processes.items() if process.poll() is not None]
            if dead:
                raise RuntimeError(f"{dead} exited while waiting for {what}:\n{self.logs()}")
            time.sleep(interval)
        raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}:\n{self.logs()}")

    def logs(self, lines: int = 30) -> str:
        """The end of every component's and every task's log."""
        parts = []
        for path in [
            *(self.home / f"{n}.log" for n in self.processes),
            *sorted(self.home.glob("logs/dag_id=*/**/*.log")),
        ]:
            if path.exists():
                text = "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
                parts.append(f"----- {path.relative_to(self.home)}\n{text}")
        return "\n".join(parts)

    @property
    def scheduler_pid(self) -> int:
        return self.processes["scheduler"].pid


def _listens(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None


@dataclass
class Interval:
    """When a process held something: ``start`` to ``end`` (seconds since the epoch; ``end`` is ``None`` while it
    lasts)."""

    start: float
    end: float | None = None
    pid: int = 0

    @property
    def seconds(self) -> float:
        if self.end is None:
            raise RuntimeError(f"process {self.pid} still holds it")
        return self.end - self.start


class WorkerWatch(threading.Thread):
    """What the LocalExecutor's worker processes do, sampled every ``tick`` seconds.

    A LocalExecutor worker (a child of the scheduler) is one executor slot. While it supervises a task its title is
    ``airflow worker -- LocalExecutor: <task instance id>`` (``<idle>`` otherwise), and it forks the task runner
    process that runs ``execute`` or ``execute_complete``. Recorded per task instance id (as the metadata DB writes
    it, without dashes): the slot's busy intervals (``slots``), and the task runner processes' lifetimes
    (``runners``: from their start time in ``/proc`` to the first sample that finds them gone or a zombie). A value
    ``probe()`` is sampled as well (``samples``: ``(time, value)`` when it changes).
    """

    PREFIX = "airflow worker -- LocalExecutor:"

    def __init__(self, scheduler_pid: int, probe: Any = None, tick: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.scheduler_pid, self.probe, self.tick = scheduler_pid, probe, tick
        self.slots: dict[str, list[Interval]] = {}
        self.runners: dict[str, list[Interval]] = {}
        self.samples: list[tuple[float, Any]] = []
        self._done = threading.Event()
        self._busy: dict[int, tuple[str, Interval]] = {}  # worker pid -> (task instance id, slot)
        self._alive: dict[int, Interval] = {}  # task runner pid -> its lifetime
        self._seen: set[int] = set()  # task runner pids recorded

    def stop(self) -> None:
        self._done.set()
        self.join()

    def run(self) -> None:
        import psutil

        workers: set[int] = set()
        next_scan = 0.0
        while not self._done.is_set():
            now = time.time()
            if now >= next_scan:  # workers are started with the scheduler: look for new ones twice a second
                with contextlib.suppress(psutil.NoSuchProcess):
                    children = psutil.Process(self.scheduler_pid).children()  # a task runner is a grandchild
                    workers = {
                        p.pid for p in children if (_read(f"/proc/{p.pid}/cmdline") or "").startswith(self.PREFIX)
                    }
                next_scan = now + 0.5
            for pid in workers | set(self._busy):  # a busy worker that is gone ends its slot
                self._sample_worker(pid, now)
            for pid, lifetime in list(self._alive.items()):
                stat = _read(f"/proc/{pid}/stat")
                if stat is None or stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X"):
                    lifetime.end = now
                    del self._alive[pid]
            if self.probe is not None:
                value = self.probe()
                if not self.samples or self.samples[-1][1] != value:
                    self.samples.append((now, value))
            self._done.wait(self.tick)

    def _sample_worker(self, pid: int, now: float) -> None:
        import psutil

        title = _read(f"/proc/{pid}/cmdline") or ""
        ti_id = title[len(self.PREFIX) :].strip().replace("-", "") if title.startswith(self.PREFIX) else "<idle>"
        current = self._busy.get(pid)
        if current is not None and current[0] != ti_id:
            current[1].end = now
            del self._busy[pid]
            current = None
        if ti_id == "<idle>":
            return
        if current is None:
            self._busy[pid] = (ti_id, Interval(now, pid=pid))
            self.slots.setdefault(ti_id, []).append(self._busy[pid][1])
        for child in map(int, (_read(f"/proc/{pid}/task/{pid}/children") or "").split()):
            if child not in self._seen:
                self._seen.add(child)
                with contextlib.suppress(psutil.NoSuchProcess):
                    self._alive[child] = Interval(psutil.Process(child).create_time(), pid=child)
                    self.runners.setdefault(ti_id, []).append(self._alive[child])
