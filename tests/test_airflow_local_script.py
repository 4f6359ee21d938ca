"""``make airflow`` (``scripts/airflow_local.py``) without starting Airflow: the settings it gives ``standalone``."""

from __future__ import annotations

import importlib.util
import os

import pytest
from conftest import REPO

LOG_SERVERS = ("AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT", "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT")


@pytest.fixture
def script(monkeypatch, tmp_path):
    """The script as a module, with an environment of its own to write into (this process's stays as it is)."""
    spec = importlib.util.spec_from_file_location("airflow_local", REPO / "scripts" / "airflow_local.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(os, "environ", {**os.environ, "AIRFLOW_HOME": str(tmp_path)})
    for name in LOG_SERVERS:
        os.environ.pop(name, None)
    return module


def configured(script, *argv: str) -> tuple[int, ...]:
    environment = dict(os.environ)
    try:
        script.configure(script.parse_args(list(argv)))
        return (int(os.environ["AIRFLOW__API__PORT"]), *(int(os.environ[name]) for name in LOG_SERVERS))
    finally:
        os.environ.clear()
        os.environ.update(environment)


def test_the_log_servers_move_with_the_api_port_so_two_instances_coexist(script):
    """Hygiene (issue 27): a second `make airflow` on another port failed on the log servers' fixed 8793 and 8794."""
    first = configured(script, "--port", "8080")
    assert first == (8080, 8793, 8794)  # Airflow's own defaults beside its default port
    instances = [first, *(configured(script, "--port", str(port)) for port in (8081, 8082, 8090, 9090, 7367, 100))]
    ports = [port for instance in instances for port in instance]
    assert len(set(ports)) == len(ports), instances  # no two instances (nor one with itself) share a port
    os.environ["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"] = "18793"
    assert configured(script, "--port", "8081")[1] == 18793  # a port set by hand wins
