"""Parsing a DAG that uses the provider must not import torch, accelerate, docker, kubernetes, ray or the runtime."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

HEAVY = ("torch", "accelerate", "docker", "kubernetes", "pynvml", "ray")


PARSE_EACH = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
heavy, report = set(HEAVY), {}
for path in sys.argv[1:]:
    before = set(sys.modules)
    bag = DagBag(dag_folder=path)
    new = set(sys.modules) - before
    report[path] = {
        "errors": {k: str(v) for k, v in bag.import_errors.items()}, "dags": len(bag.dags),
        "heavy": sorted(m for m in new if m.split(".")[0] in heavy),
        "runtime": sorted(m for m in new if m.startswith("airflow_gpu_provider.runtime.")
                          and m != "airflow_gpu_provider.runtime.protocol"),
    }
print(json.dumps({"files": report, "heavy": sorted(m for m in sys.modules if m.split(".")[0] in heavy)}))
"""


def test_parsing_example_dags_imports_nothing_heavy():
    """Every example DAG, parsed in turn in one interpreter: a heavy import is named with the file whose parse made it."""
    files = sorted(str(p) for p in (REPO / "dags").glob("*.py"))
    code = PARSE_EACH.replace("set(HEAVY)", repr(set(HEAVY)))
    out = subprocess.run([sys.executable, "-c", code, *files], capture_output=True, text=True, check=True).stdout
    found = json.loads(out.strip().splitlines()[-1])
    assert set(found["files"]) == set(files) and len(files) >= 8
    for dag_file, report in found["files"].items():
        assert report["errors"] == {}, dag_file
        assert report["dags"] >= 1, dag_file
        assert report["heavy"] == [], dag_file
        assert report["runtime"] == [], dag_file  # the shipped runtime is the task's, not the parser's (its protocol)
    assert found["heavy"] == []


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
