"""run() as far as it can go without a cluster: a real dag.test() of the Kubernetes example DAG whose kubeconfig
points at a closed port (through the kubernetes_default connection's kube_config_path). The task gets as far as its
first API call (the creation of the task's Secret, before KubernetesPodOperator's pod search) in the configured
namespace, then fails. This shows the wiring (task context, connection and
kubeconfig handling, namespace, labels); it does not show a pod running, which needs a cluster."""

from __future__ import annotations

import json

import pytest
from cluster_answers import KUBECONFIG
from conftest import REPO
from helpers import run_dag, task_states


@pytest.mark.slow
def test_task_reaches_the_api_server_of_the_kubeconfig_and_fails_cleanly(
    airflow_home, tmp_path, monkeypatch, capfd, caplog
):
    from airflow.dag_processing.dagbag import DagBag

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    # the DAG uses the default connection; point it at the kubeconfig, as a deployment would
    extra = json.dumps({"kube_config_path": str(kubeconfig)})
    monkeypatch.setenv("AIRFLOW_CONN_KUBERNETES_DEFAULT", json.dumps({"conn_type": "kubernetes", "extra": extra}))
    dag = DagBag(dag_folder=str(REPO / "dags" / "example_kubernetes_gpu.py")).get_dag("example_kubernetes_gpu")
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"fine_tune": "failed"}
    output = capfd.readouterr()
    log = output.out + output.err + caplog.text  # where Airflow's logging goes depends on earlier tests
    assert "host='127.0.0.1', port=9" in log
    assert "Connection refused" in log
    assert "/api/v1/namespaces/ml/secrets" in log  # the task's Secret, named after its pod
    assert "/api/v1/namespaces/ml/pods" not in log  # no pod without its Secret
