"""Parsing a DAG that uses the provider must not import torch, accelerate, docker, kubernetes, ray or the runtime."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

HEAVY = ("torch", "accelerate", "docker", "kubernetes", "pynvml", "ray")


@pytest.mark.parametrize("dag_file", sorted(str(p) for p in (REPO / "dags").glob("*.py")))
def test_parsing_example_dags_imports_nothing_heavy(dag_file):
    code = (
        "import json, sys; from airflow.dag_processing.dagbag import DagBag;"
        f"bag = DagBag(dag_folder={dag_file!r});"
        "print(json.dumps({'errors': {k: str(v) for k, v in bag.import_errors.items()}, 'dags': len(bag.dags),"
        f" 'heavy': sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}),"
        " 'runtime': sorted(m for m in sys.modules if m.startswith('airflow_gpu_provider.runtime.')"
        " and m != 'airflow_gpu_provider.runtime.protocol')}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    report = json.loads(out.strip().splitlines()[-1])
    assert report["errors"] == {}
    assert report["dags"] >= 1
    assert report["heavy"] == []
    assert report["runtime"] == []  # the shipped runtime is the task's, not the parser's (its protocol may be read)


def _heavy_modules_parsing(dag_file: str, executor: str) -> list[str]:
    code = (
        "import json, sys; from airflow.dag_processing.dagbag import DagBag;"
        f"bag = DagBag(dag_folder={dag_file!r}); assert not bag.import_errors, bag.import_errors;"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules if m.split('.')[0] in {HEAVY!r}}})))"
    )
    environment = {**os.environ, "AIRFLOW__CORE__EXECUTOR": executor}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=environment)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("executor", "heavy"),
    [
        ("CeleryExecutor", []),
        ("airflow.providers.edge3.executors.EdgeExecutor", []),
        ("KubernetesExecutor", ["kubernetes"]),
    ],
)
def test_the_executor_backend_imports_the_kubernetes_client_only_for_kubernetes_executor(executor, heavy):
    """A pod_override is a V1Pod: only tasks that go to KubernetesExecutor pay for the client, nothing else heavy."""
    assert _heavy_modules_parsing(str(REPO / "tests" / "dags" / "executor_dags.py"), executor) == heavy
