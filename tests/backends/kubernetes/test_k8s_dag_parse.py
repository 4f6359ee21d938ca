"""Parsing a DAG with Kubernetes GPU tasks must not import the kubernetes client or the cncf-kubernetes provider."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO

PROBE = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
# Airflow itself loads these small modules (provider discovery; airflow/exceptions.py); nothing else may load.
discovery = {"airflow.providers.cncf", "airflow.providers.cncf.kubernetes",
             "airflow.providers.cncf.kubernetes.get_provider_info", "airflow.providers.cncf.kubernetes.exceptions"}
heavy = sorted(m for m in sys.modules if m not in discovery and (m == "kubernetes" or m.startswith(
    ("kubernetes.", "kubernetes_asyncio", "airflow.providers.cncf."))))
print(json.dumps({"errors": {k: str(v) for k, v in bag.import_errors.items()}, "dags": sorted(bag.dags), "heavy": heavy,
                  "backend_checked": "airflow_gpu_provider.backends.kubernetes" in sys.modules}))
"""


def test_parsing_the_kubernetes_example_dag_does_not_import_the_kubernetes_client(airflow_home):
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(REPO / "dags" / "example_kubernetes_gpu.py")],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ.copy(),
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["errors"] == {}
    assert report["dags"] == ["example_kubernetes_gpu"]
    assert report["heavy"] == []
    assert report["backend_checked"]  # the backend's parse-time checks ran, without the client
