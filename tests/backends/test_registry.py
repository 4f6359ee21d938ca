"""The registry: a backend is one package and one entry, and the operators ask it what a backend can do."""

from __future__ import annotations

import pytest
from conftest import REPO
from helpers import load_dag, run_dag, task_states, xcom

from airflow_gpu_provider import GpuStepOperator
from airflow_gpu_provider.backends import BACKENDS, BackendInfo
from airflow_gpu_provider.exceptions import InvalidSettingError, MissingDependencyError, UnknownSettingError
from airflow_gpu_provider.settings import ResourceSettings


@pytest.fixture
def inline(monkeypatch):
    """The fourth backend of tests/backends/fourth_backend.py, registered with one entry."""
    monkeypatch.setitem(
        BACKENDS,
        "inline",
        BackendInfo("inline", backend="fourth_backend:InlineBackend", options="fourth_backend:InlineOptions"),
    )


def test_a_fourth_backend_is_one_module_pair_and_one_registry_entry(inline, airflow_home):
    dr = run_dag(load_dag(REPO / "tests" / "dags" / "registry_dags.py", "fourth_backend"))
    assert task_states(dr) == {"add": "success"}
    assert xcom(dr, "add") == {"sum": 5}


def test_its_options_are_checked_at_parse_time(inline):
    with pytest.raises(UnknownSettingError, match="backend 'inline' does not support the option"):
        GpuStepOperator(task_id="t", command=["true"], backend="inline", backend_options={"pythn": "x"})


def test_capabilities_come_from_the_registry(inline):
    with pytest.raises(
        InvalidSettingError, match="'all' works only on the local and docker and executor and inline backends"
    ):
        BACKENDS["kubernetes"].check(ResourceSettings(gpu_count="all"), 1, BACKENDS["kubernetes"].parse_options({}))
    with pytest.raises(InvalidSettingError, match="backend 'inline' runs on one machine"):
        BACKENDS["inline"].check(ResourceSettings(), 2, BACKENDS["inline"].parse_options({}))


def test_a_missing_dependency_names_the_pip_extra(monkeypatch):
    monkeypatch.setitem(
        BACKENDS,
        "slurm",
        BackendInfo("slurm", backend="pyslurm_is_not_installed:SlurmBackend", options="x:Y", extra="slurm"),
    )
    with pytest.raises(MissingDependencyError, match=r"pip install 'airflow-gpu-provider\[slurm\]'"):
        BACKENDS["slurm"].backend_class()
