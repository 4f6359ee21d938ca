"""A real ``airflow standalone`` (through ``scripts/airflow_local.py``) for end-to-end tests, and its REST API.

It runs in its own process group with its own AIRFLOW_HOME and free ports; :meth:`LocalAirflow.stop` stops the
whole group (and any descendant that left it), so no process outlives the tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT = 240.0
STOP_GRACE = 45.0  # more than the script gives its components
REQUEST_TIMEOUT = 90.0  # an API server on a host whose CPUs are all taken answers slowly
POLL = 0.2  # seconds between two looks at a state the test waits for


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalAirflow:
    """``scripts/airflow_local.py`` started in a fresh AIRFLOW_HOME, plus a small REST client."""

    def __init__(self, home: Path, devices: str = "0,1") -> None:
        self.home = home
        self.devices = devices
        self.port = free_port()
        self.url = f"http://localhost:{self.port}"
        self.log_path = home / "standalone.log"
        self.ready: dict[str, Any] = {}
        self.process: subprocess.Popen[bytes] | None = None
        self._token: str | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> LocalAirflow:
        """Start and wait until every component is healthy (``START_TIMEOUT`` at most)."""
        self.home.mkdir(parents=True, exist_ok=True)
        ready_file = self.home / "ready.json"
        # the DAG processor parses dags/ alone (the script's default bundle; not the test DAGs the session's bundle
        # list adds), once: its files do not change while a test runs, and parsing them again every 30 s took a
        # sixth of a core
        inherited = {k: v for k, v in os.environ.items() if k != "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"}
        environment = {
            **inherited,
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3600",
            "AIRFLOW__GPU__STATE_DIR": str(self.home / "gpu-state"),
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__GPU__POLL_INTERVAL": "0.5",
            # the clusters the tests' DAGs name (tests/dags/slurm_dags.py), as this deployment's admin lists them
            "AIRFLOW__GPU_POLICY__ALLOWED_CLUSTERS": "slurm=slurm_test, slurm=slurm_rest",
            # the Docker tasks' parent image (no registry can be reached: the local base image): the engine's
            # connection's extra
            "AIRFLOW_CONN_DOCKER_DEFAULT": json.dumps(
                {
                    "conn_type": "docker",
                    "extra": {
                        "parent_image": os.environ.get("AIRFLOW_GPU_TEST_BASE_IMAGE", "airflow-gpu-base:bookworm")
                    },
                }
            ),
        }
        command = [
            sys.executable,
            str(REPO / "scripts" / "airflow_local.py"),
            f"--port={self.port}",
            f"--devices={self.devices}",
            f"--ready-file={ready_file}",
            f"--timeout={START_TIMEOUT}",
        ]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                command, env=environment, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT + 30
        while not ready_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"local Airflow did not start; log tail:\n{self.log_tail()}")
            time.sleep(POLL)
        self.ready = json.loads(ready_file.read_text())
        return self

    def stop(self) -> None:
        """SIGTERM the process group (the script then stops standalone's own group), then SIGKILL what is left."""
        if self.process is None:
            return
        import psutil

        try:
            tree = [psutil.Process(self.process.pid), *psutil.Process(self.process.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(STOP_GRACE)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        _, alive = psutil.wait_procs(tree, timeout=5)
        for process in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        self.process.wait()
        self.process = None

    def leftover_processes(self) -> list[str]:
        """Live processes (zombies aside) that still run with this AIRFLOW_HOME."""
        import psutil

        found = []
        for process in psutil.process_iter(["pid", "cmdline", "status"]):
            try:
                if process.info["status"] == psutil.STATUS_ZOMBIE or process.pid == os.getpid():
                    continue
                if process.environ().get("AIRFLOW_HOME") == str(self.home):
                    found.append(f"{process.pid} {' '.join(process.info['cmdline'] or [])}")
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    def log_tail(self, lines: int = 60) -> str:
        """The end of the standalone output, for failure messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # ------------------------------------------------------------------ REST API
    def token(self) -> str:
        """The admin's API token (``POST /auth/token``), fetched once."""
        if self._token is None:
            credentials = {"username": self.ready["username"], "password": self.ready["password"]}
            self._token = self._request("POST", "/auth/token", credentials)["access_token"]
        return self._token

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """Call the REST API as admin (a token from ``POST /auth/token``); return the decoded JSON."""
        return self._request(method, path, body, {"Authorization": f"Bearer {self.token()}"})

    def _request(self, method: str, path: str, body: Any, headers: dict[str, str] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})}
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as response:
                raw = response.read()
        except urllib.error.HTTPError as err:
            raise AssertionError(f"{method} {path} -> {err.code}: {err.read().decode(errors='replace')}") from None
        return json.loads(raw) if raw else None

    def wait_for_dag(self, dag_id: str, timeout: float = 120) -> dict[str, Any]:
        """Wait until the DAG processor has parsed ``dag_id``."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.api("GET", f"/api/v2/dags?dag_id_pattern={urllib.request.quote(dag_id)}&limit=100")["dags"]
            dags = {d["dag_id"]: d for d in found}  # by name: the folders hold more DAGs than one page
            if dag_id in dags:
                return dags[dag_id]
            if time.monotonic() > deadline:
                raise AssertionError(f"DAG {dag_id!r} not parsed after {timeout}s; DAGs: {sorted(dags)}")
            time.sleep(POLL)

    def unpause(self, dag_id: str) -> None:
        """``PATCH /api/v2/dags/{id}`` with ``is_paused: false``."""
        self.api("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})

    def trigger(self, dag_id: str, conf: dict[str, Any]) -> str:
        """``POST /api/v2/dags/{id}/dagRuns``; return the run id."""
        return self.api("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf})["dag_run_id"]

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 300) -> dict[str, Any]:
        """Poll the run until it is finished; return it."""
        deadline = time.monotonic() + timeout
        quoted = urllib.request.quote(run_id, safe="")
        while True:
            run = self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quoted}")
            if run["state"] in ("success", "failed"):
                return run
            if time.monotonic() > deadline:
                raise AssertionError(f"run {run_id} still {run['state']} after {timeout}s:\n{self.log_tail()}")
            time.sleep(POLL)

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """Every task instance of a run (mapped ones included)."""
        quoted = urllib.request.quote(run_id, safe="")
        return self.api("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quoted}/taskInstances?limit=100")["task_instances"]

    def xcom(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1, key: str = "return_value") -> Any:
        """A task's XCom (``return_value`` unless ``key`` says otherwise), deserialized."""
        quoted = urllib.request.quote(run_id, safe="")
        path = (
            f"/api/v2/dags/{dag_id}/dagRuns/{quoted}/taskInstances/{task_id}/xcomEntries/{key}"
            f"?map_index={map_index}&deserialize=true&stringify=false"
        )
        return self.api("GET", path)["value"]
