"""The DAG processor imports the provider's parse path before it forks its parse children (decorators/preload.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.usefixtures("airflow_home")

#: Builds the job runner as ``airflow <command>`` does (its Job() calls the listeners' on_starting), then reports
#: which of the provider's modules are imported.
JOB = """
import argparse, json, sys
from airflow.utils.providers_configuration_loader import providers_configuration_loaded
command = sys.argv[1]
sys.argv = ["airflow", command]
if command == "dag-processor":
    from airflow.cli.commands import dag_processor_command as cli
    providers_configuration_loaded(cli._create_dag_processor_job_runner)(argparse.Namespace(bundle_name=None, num_runs=-1))
else:  # another component's job: its listeners are called alike
    from airflow.jobs.job import Job
    Job()
print(json.dumps(sorted(m for m in sys.modules if m.startswith("airflow_gpu_provider."))))
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""


def _imported(command: str, **environment: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", JOB, command],
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-2])


def _third_party(command: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", JOB, command], env={**os.environ, "AIRFLOW__CORE__EXECUTOR": "LocalExecutor"},
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])


def test_the_dag_processor_imports_the_parse_path_once_unless_told_not_to():
    imported = _imported("dag-processor")
    assert "airflow_gpu_provider.decorators.gpu" in imported
    assert "airflow_gpu_provider.backends.local.options" in imported  # each backend's parse half
    assert "airflow_gpu_provider.backends.executor.placement" in imported
    assert not [m for m in imported if m.startswith("airflow_gpu_provider.backends.") and m.endswith(".backend")]
    off = _imported("dag-processor", AIRFLOW__DAG_PROCESSOR__PARSING_PRE_IMPORT_MODULES="False")
    assert "airflow_gpu_provider.decorators.gpu" not in off
    celery = {"AIRFLOW__CORE__EXECUTOR": "CeleryExecutor"}
    assert "airflow_gpu_provider.decorators.gpu" not in _imported("scheduler", **celery)  # other components: nothing


def test_the_scheduler_of_a_local_executor_imports_the_run_half_its_task_processes_inherit():
    """The LocalExecutor forks its task processes from the scheduler (no exec): they find the run half imported."""
    imported = _imported("scheduler", AIRFLOW__CORE__EXECUTOR="LocalExecutor")
    for module in ("operators.execution", "backends.local.backend", "telemetry.report", "host.allocator"):
        assert f"airflow_gpu_provider.{module}" in imported, module
    heavy = {"docker", "kubernetes", "ray", "torch"} & set(_third_party("scheduler"))
    assert not heavy  # the local run half: the standard library and the provider alone
