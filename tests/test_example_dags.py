"""The example DAGs read well in the UI, and GPU tasks join the GPU pool, mapped ones included."""

from __future__ import annotations

import pytest
from conftest import REPO
from helpers import dag_bag

from airflow_gpu_provider import ResourceSettings
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.operators.spec import TaskSpec, beside_spec

pytestmark = pytest.mark.smoke  # also on the oldest supported Airflow
GPU_PARAMS = {"epochs", "batch_size", "mixed_precision", "backend", "on_missing_gpu"}


def _bag():
    bag = dag_bag(REPO / "dags")
    assert bag.import_errors == {}
    return bag


def test_every_example_dag_has_tags_docs_and_described_params(airflow_home):
    bag = _bag()
    assert {"gpu_training_demo", "gpu_hyperparameter_sweep"} <= set(bag.dag_ids)
    for dag_id in bag.dag_ids:
        dag = bag.get_dag(dag_id)
        assert "gpu" in dag.tags, dag_id
        assert dag.doc_md and dag.doc_md.strip().startswith("###"), dag_id
        pinned = {"backend"} if {"kubernetes", "ray"} & set(dag.tags) else set()  # its tasks pin their backend
        assert set(dag.params) >= GPU_PARAMS - pinned, (dag_id, set(dag.params))
        for name in dag.params:
            param = dag.params.get_param(name)
            assert param.description, (dag_id, name)
            assert param.value is not None, (dag_id, name)
        assert dag.params.get_param("on_missing_gpu").schema["enum"] == ["fail", "wait", "cpu"]
        if not pinned:
            assert dag.params.get_param("backend").schema["enum"] == ["local", "docker", "kubernetes", "ray", "slurm"]


def test_gpu_tasks_join_the_gpu_pool(airflow_home, monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU__POOL", "gpu")
    bag = _bag()
    train = bag.get_dag("gpu_training_demo").get_task("train")
    assert (train.pool, train.pool_slots) == ("gpu", 1)  # templated gpu_count: one slot
    assert bag.get_dag("gpu_training_demo").get_task("report").pool == "default_pool"
    trial = bag.get_dag("gpu_hyperparameter_sweep").get_task("trial")
    assert trial.is_mapped
    assert (trial.partial_kwargs["pool"], trial.partial_kwargs["pool_slots"]) == ("gpu", 1)


def settled(kwargs: dict) -> tuple[TaskSpec, dict]:
    """What the decorator does with its arguments: the settled task, and the operator's placed arguments."""
    spec = TaskSpec.settle("@task.gpu('t')", kwargs)
    return spec, spec.placed(beside_spec(kwargs))


def test_no_pool_when_unset(monkeypatch):
    monkeypatch.delenv("AIRFLOW__GPU__POOL", raising=False)
    assert "pool" not in settled({"gpu_count": 2})[1]


def test_the_decorator_settles_resources_once_and_places_the_pool(monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU__POOL", "gpus")
    resources = ResourceSettings(gpu_count=2, memory="1Gi", gpu_vendor="amd")
    spec, kwargs = settled({"resources": resources, "task_id": "t"})
    # resources travel in the spec, not as BaseOperator(resources=...), which Airflow reads as its own
    assert kwargs == {"task_id": "t", "pool": "gpus", "pool_slots": 2}
    assert spec.resources is resources  # the object itself, not rebuilt
    assert settled({"resources": resources, "gpu_count": 3})[0].resources.gpu_count == 3
    # an explicit shortcut wins over resources, as in GpuStepOperator; an explicit pool is left alone
    spec, kwargs = settled({"resources": resources, "gpu_count": "{{ params.n }}", "pool": "mine"})
    assert spec.templated == {"gpu_count": "{{ params.n }}"} and spec.resources is resources
    assert (kwargs["pool"], "pool_slots" in kwargs) == ("mine", False)
    assert settled({"gpu_count": "{{ params.n }}"})[1]["pool_slots"] == 1
    assert "pool" not in settled({"cpu_count": 2})[1]


def test_the_decorator_rejects_bad_resources_at_parse_time():
    with pytest.raises(InvalidSettingError, match=r"gpu_count"):
        settled({"gpu_count": -1})


def test_gpu_params_offer_the_accepted_values():
    from airflow_gpu_provider.backends import BACKENDS
    from airflow_gpu_provider.params import gpu_params
    from airflow_gpu_provider.task.missing_gpu import POLICIES as MISSING_GPU_POLICIES

    params = gpu_params(gpu_count=2, max_gpus=4, backend="docker", on_missing_gpu="wait")
    assert list(params) == ["gpu_count", "mixed_precision", "backend", "on_missing_gpu"]
    assert (params["gpu_count"].value, params["gpu_count"].schema["maximum"]) == (2, 4)
    # the executor backend is placed when the DAG is parsed: a trigger-form choice cannot place a task
    assert params["backend"].schema["enum"] == [name for name in BACKENDS if name != "executor"]
    assert params["on_missing_gpu"].schema["enum"] == list(MISSING_GPU_POLICIES)
    assert (params["backend"].value, params["on_missing_gpu"].value) == ("docker", "wait")
    assert list(gpu_params(gpu_count=None, mixed_precision=None)) == ["backend", "on_missing_gpu"]
