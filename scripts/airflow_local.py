"""Start a real local Airflow 3 with the provider and ``dags/`` (``make airflow``).

``airflow standalone`` runs the API server, scheduler, DAG processor and triggerer on SQLite with the
LocalExecutor. Before it starts, this script migrates the database and creates the GPU pool sized to this host's
GPUs (NVML, or ``[gpu] devices``) and points ``[gpu] pool`` at it; once every component is healthy it prints the
URL and the admin password. Stop it with Ctrl-C (or SIGTERM): it stops every component.

    python scripts/airflow_local.py [--port 8080] [--devices auto|none|0,1] [--pool gpu] [--ready-file PATH]

A port other than 8080 also sets ``AIRFLOW__API__BASE_URL=http://localhost:PORT``: without it, tasks cannot reach
the execution API. The worker's and the triggerer's log servers move with it (Airflow's 8793 and 8794 beside 8080,
two further for each port above: ``log_server_ports``), so that two instances on one machine do not collide; set
``AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT`` / ``TRIGGER_LOG_SERVER_PORT`` to choose them yourself.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
COMPONENTS = ("metadatabase", "scheduler", "dag_processor", "triggerer")
STOP_GRACE_SECONDS = 30


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=int(os.environ.get("AIRFLOW__API__PORT", "8080")))
    parser.add_argument("--devices", help="[gpu] devices: auto (NVML), none, or ids such as 0,1 (default: config)")
    parser.add_argument("--pool", default="gpu", help="name of the GPU pool (default: gpu)")
    parser.add_argument("--dags-folder", type=Path, default=REPO / "dags")
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for a healthy Airflow")
    parser.add_argument("--ready-file", type=Path, help="write the URL and credentials here as JSON when ready")
    return parser.parse_args(argv)


def log_server_ports(api_port: int) -> tuple[int, int]:
    """The worker's and the triggerer's log-server ports for an API port: 8793 and 8794 for 8080, +2 per port above.

    Where that would meet the API port itself or leave the range of ports, two free ones from the system.
    """
    worker = 8793 + 2 * (api_port - 8080)
    if worker in (api_port, api_port - 1) or not 1024 <= worker <= 65534:
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            second.bind(("127.0.0.1", 0))
            return first.getsockname()[1], second.getsockname()[1]
    return worker, worker + 1


def configure(args: argparse.Namespace) -> None:
    """Set this process's environment, which Airflow reads at import and ``airflow standalone`` inherits."""
    home = Path(os.environ.setdefault("AIRFLOW_HOME", str(REPO / ".airflow-home")))
    home.mkdir(parents=True, exist_ok=True)
    url = f"http://localhost:{args.port}"
    os.environ.update(
        {
            "AIRFLOW__CORE__DAGS_FOLDER": str(args.dags_folder.resolve()),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__API__PORT": str(args.port),
            "AIRFLOW__API__BASE_URL": url,
            # `airflow standalone` starts its components as `airflow ...` from PATH: use this interpreter's.
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
    )
    worker_logs, trigger_logs = log_server_ports(args.port)  # two instances: neither log server collides
    os.environ.setdefault("AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT", str(worker_logs))
    os.environ.setdefault("AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT", str(trigger_logs))
    os.environ.setdefault("AIRFLOW__GPU__STATE_DIR", str(home / "gpu-state"))
    # what dags/example_kubernetes_gpu.py names of the cluster, as an admin lists it (docs/kubernetes-admin.md)
    os.environ.setdefault("AIRFLOW__GPU_POLICY__ALLOWED_OBJECTS", "namespace=ml, service_account=trainer")
    os.environ.setdefault("AIRFLOW__API__HOST", "127.0.0.1")  # 0.0.0.0 to reach it from other machines
    os.environ.setdefault("AIRFLOW__CORE__PARALLELISM", "8")  # LocalExecutor worker processes
    if args.devices is not None:
        os.environ["AIRFLOW__GPU__DEVICES"] = args.devices


def create_gpu_pool(name: str) -> int:
    """Migrate the DB; size pool ``name`` to this host's GPUs and set ``[gpu] pool``. Return the GPU count."""
    from airflow.models.pool import Pool
    from airflow.utils import db

    from airflow_gpu_provider import config
    from airflow_gpu_provider.host.inventory import host_devices

    db.initdb()
    option = config.get("devices")
    devices = host_devices(option)
    if not devices:
        print(f"No GPUs found ([gpu] devices={option!r}): no GPU pool; GPU tasks follow on_missing_gpu.")
        os.environ.pop("AIRFLOW__GPU__POOL", None)
        return 0
    source = "NVML" if option.strip().lower() == "auto" else "[gpu] devices"
    description = f"GPUs of this host ({source}): {', '.join(d.name or d.id for d in devices)}"
    Pool.create_or_update_pool(name, len(devices), description, include_deferred=False)
    os.environ["AIRFLOW__GPU__POOL"] = name
    return len(devices)


def health(url: str) -> dict[str, Any] | None:
    """The API server's health report, or ``None`` while it does not answer."""
    try:
        with urllib.request.urlopen(f"{url}/api/v2/monitor/health", timeout=5) as response:  # noqa: S310 - localhost
            return json.load(response)
    except (OSError, ValueError):
        return None


def is_healthy(report: dict[str, Any] | None) -> bool:
    """Whether every component reports ``healthy``."""
    return report is not None and all((report.get(name) or {}).get("status") == "healthy" for name in COMPONENTS)


def admin_password(home: Path) -> str | None:
    """The password ``airflow standalone`` generated for ``admin`` (SimpleAuthManager)."""
    path = home / "simple_auth_manager_passwords.json.generated"
    try:
        return json.loads(path.read_text()).get("admin")
    except (OSError, ValueError):
        return None


def group_alive(pgid: int) -> bool:
    """Whether a live process (zombies aside) is left in process group ``pgid``."""
    import psutil

    for process in psutil.process_iter(["status"]):
        with contextlib.suppress(OSError, psutil.Error):
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                return True
    return False


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM ``airflow standalone`` and its components (its own process group); SIGKILL what outlives the grace."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    while time.monotonic() < deadline and (process.poll() is None or group_alive(process.pid)):
        time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def main(argv: list[str] | None = None) -> int:
    """Set up, start ``airflow standalone``, report when it is healthy, and wait for it."""
    args = parse_args(argv)
    configure(args)
    started = time.monotonic()
    gpus = create_gpu_pool(args.pool)
    environment = dict(os.environ)
    url = environment["AIRFLOW__API__BASE_URL"]
    # Its own process group: the script stops it (and its components) whichever signal the script gets.
    process = subprocess.Popen([sys.executable, "-m", "airflow", "standalone"], env=environment, start_new_session=True)

    def on_signal(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)
    try:
        while not is_healthy(health(url)):
            if process.poll() is not None:
                print(f"airflow standalone exited with status {process.returncode}", file=sys.stderr)
                stop(process)
                return process.returncode or 1
            if time.monotonic() - started > args.timeout:
                print(f"Airflow was not healthy after {args.timeout:.0f}s: {health(url)}", file=sys.stderr)
                stop(process)
                return 1
            time.sleep(1)
        home = Path(environment["AIRFLOW_HOME"])
        ready = {
            "url": url,
            "username": "admin",
            "password": admin_password(home),
            "pool": environment.get("AIRFLOW__GPU__POOL"),
            "gpus": gpus,
            "seconds_to_ready": round(time.monotonic() - started, 1),
        }
        pool_text = f"pool {args.pool!r} with {gpus} slot(s)" if gpus else "no GPU pool (no GPUs found)"
        print(
            f"\n=== Airflow is ready in {ready['seconds_to_ready']}s: {url}\n"
            f"=== user: admin   password: {ready['password']}\n"
            f"=== GPUs: {gpus}, {pool_text}; DAGs from {environment['AIRFLOW__CORE__DAGS_FOLDER']}\n"
            f"=== AIRFLOW_HOME={home}; stop with Ctrl-C\n",
            flush=True,
        )
        if args.ready_file:
            args.ready_file.write_text(json.dumps(ready))
        process.wait()
        print(f"airflow standalone exited with status {process.returncode}", file=sys.stderr)
        return process.returncode or 1
    except KeyboardInterrupt:
        print("\n=== stopping Airflow", flush=True)
        stop(process)
        return 0


if __name__ == "__main__":
    sys.exit(main())
