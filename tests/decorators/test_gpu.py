"""@gpu_task and @task.gpu through real Airflow."""

from __future__ import annotations

import pytest
from airflow.sdk import task
from conftest import REPO
from helpers import load_dag, run_dag, task_states, xcom

from airflow_gpu_provider import gpu_task
from airflow_gpu_provider.decorators.gpu import _GpuDecoratedOperator

pytestmark = pytest.mark.usefixtures("airflow_home")


def test_task_gpu_resolves_to_the_provider_decorator():
    assert task.gpu is gpu_task


def test_decorated_tasks_are_gpu_step_operators_with_their_settings():
    dag = load_dag(REPO / "tests" / "dags" / "gpu_step_dags.py", "gpu_task_flow")
    split = dag.get_task("split")
    assert isinstance(split, _GpuDecoratedOperator)
    assert split.task_spec.resources.gpu_count == 1
    assert split.on_missing_gpu == "cpu"
    assert dag.get_task("stats").multiple_outputs is True
    assert dag.get_task("combine").task_spec.resources.memory == 2**30
    assert "@" not in split.shipped.source


def test_taskflow_arguments_xcom_and_multiple_outputs():
    dr = run_dag(load_dag(REPO / "tests" / "dags" / "gpu_step_dags.py", "gpu_task_flow"))
    assert task_states(dr) == {"split": "success", "stats": "success", "combine": "success"}
    assert xcom(dr, "split") == {"half": 5.5, "double": 22}
    assert xcom(dr, "stats", key="total") == 6
    assert xcom(dr, "stats", key="count") == 3
    assert xcom(dr, "combine") == "5.5/6/3"
