"""Parse-time placement of the executor backend: queue, executor, pools; bad input fails at parse, naming the field."""

from __future__ import annotations

import pytest

from airflow_gpu_provider import GpuStepOperator
from airflow_gpu_provider.backends.executor.executors import configured
from airflow_gpu_provider.exceptions import InvalidSettingError, UnknownSettingError
from airflow_gpu_provider.operators.spec import TaskSpec
from airflow_gpu_provider.pools import placement as pools


def op(**kwargs) -> GpuStepOperator:
    return GpuStepOperator(task_id="t", command=["true"], backend="executor", **kwargs)


@pytest.fixture
def celery(monkeypatch):
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "CeleryExecutor")
    for name in ("QUEUE", "EXECUTOR", "POOL", "INVENTORY"):
        monkeypatch.delenv(f"AIRFLOW__GPU__{name}", raising=False)


def test_celery_and_edge_gpu_tasks_go_to_the_gpu_queue_cpu_tasks_keep_theirs(celery, monkeypatch):
    assert op(gpu_count=1).queue == "gpu"
    assert op().queue == "default"
    assert op(gpu_count=1, queue="mine").queue == "mine"  # the task's own queue wins
    monkeypatch.setenv("AIRFLOW__GPU__QUEUE", "gpu-{accelerator}")
    assert op(gpu_count=1, accelerator="A100-80GB").queue == "gpu-a100-80gb"
    assert op(gpu_count=1, accelerator="H100", backend_options={"queue": "big"}).queue == "big"
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "airflow.providers.edge3.executors.EdgeExecutor")
    assert op(gpu_count=2, accelerator="L4").queue == "gpu-l4"
    assert op(gpu_count=1, accelerator="L4").executor is None  # one executor: the default


def test_multiple_executors_gpu_tasks_go_to_gpu_executor(celery, monkeypatch):
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor,edge:airflow.providers.edge3.executors.EdgeExecutor")
    monkeypatch.setenv("AIRFLOW__GPU__EXECUTOR", "EdgeExecutor")
    task = op(gpu_count=1)
    assert (task.executor, task.queue) == ("edge", "gpu")  # named as Airflow knows it: the alias
    plain = op()
    assert (plain.executor, plain.queue) == (None, "default")
    assert op(gpu_count=1, executor="LocalExecutor").queue == "default"  # the task's executor wins: nothing to place


def test_the_decorator_places_mapped_tasks_too(celery):
    spec = TaskSpec.settle("@task.gpu('t')", {"backend": "executor", "gpu_count": 1})
    assert spec.placed({"task_id": "t"})["queue"] == "gpu"


def test_local_executor_places_nothing(monkeypatch, celery):
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")
    task = op(gpu_count=1)
    assert (task.queue, task.executor, task.executor_config) == ("default", None, {})


def test_nothing_is_placed_again_inside_a_kubernetes_executor_pod(celery, monkeypatch):
    """The worker pod parses the DAG again to run the task, often with [core] executor = LocalExecutor (Helm chart)."""
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")
    monkeypatch.setenv("AIRFLOW__GPU__EXECUTOR", "KubernetesExecutor")
    with pytest.raises(InvalidSettingError, match="not an executor of"):
        op(gpu_count=1)
    monkeypatch.setenv("AIRFLOW_IS_K8S_EXECUTOR_POD", "True")
    assert op(gpu_count=1).executor_config == {}


def test_configured_executors_read_aliases_and_paths():
    found = configured("LocalExecutor, gpu:my.module.KubernetesExecutor ,")
    assert [(e.name, e.kind) for e in found] == [("LocalExecutor", "local"), ("gpu", "kubernetes")]


# ------------------------------------------------------------------ pools per worker class
def test_one_pool_per_accelerator_sized_from_the_inventory(celery, monkeypatch, airflow_home):
    monkeypatch.setenv("AIRFLOW__GPU__POOL", "gpu-{accelerator}")
    monkeypatch.setenv("AIRFLOW__GPU__INVENTORY", "A100=16, H100=8")
    task = op(gpu_count=2, accelerator="A100")
    assert (task.pool, task.pool_slots) == ("gpu-a100", 2)
    assert pools.sizes() == {"gpu-a100": 16, "gpu-h100": 8}
    assert pools.is_gpu_pool("gpu-h100") and not pools.is_gpu_pool("default_pool")
    monkeypatch.setenv("AIRFLOW__GPU__POOL", "{queue}")
    monkeypatch.setenv("AIRFLOW__GPU__QUEUE", "gpu-{accelerator}")
    assert op(gpu_count=1, accelerator="H100").pool == "gpu-h100"
    assert pools.is_gpu_pool("gpu-h100", "gpu-h100") and not pools.is_gpu_pool("default_pool", "default")
    monkeypatch.setenv("AIRFLOW__GPU__POOL", "gpus")
    monkeypatch.setenv("AIRFLOW__GPU__INVENTORY", "A100=16, *=4")
    assert pools.sizes() == {"gpus": 20}


def test_the_scheduler_creates_missing_pools_and_leaves_resized_ones(monkeypatch, airflow_home):
    from airflow.models.pool import Pool
    from airflow.utils.session import create_session

    monkeypatch.setenv("AIRFLOW__GPU__POOL", "sched-{accelerator}")
    monkeypatch.setenv("AIRFLOW__GPU__INVENTORY", "A100=16, H100=8")
    with create_session() as session:
        session.query(Pool).filter(Pool.pool.like("sched-%")).delete(synchronize_session=False)
        session.add(Pool(pool="sched-h100", slots=3, include_deferred=False))
    with create_session() as session:
        done = pools.ensure_pools(session)
    assert done["sched-a100"] == "created"
    assert "has 3 slots, [gpu] inventory says 8" in done["sched-h100"]
    with create_session() as session:
        assert Pool.get_pool("sched-a100", session=session).slots == 16
        assert Pool.get_pool("sched-h100", session=session).slots == 3
        assert pools.ensure_pools(session)["sched-a100"] == "ok"


# ------------------------------------------------------------------ bad input: errors at parse, naming the field
def test_a_templated_resource_cannot_place_a_task(celery):
    with pytest.raises(InvalidSettingError, match="executor backend places the task when the DAG is parsed") as err:
        op(gpu_count="{{ params.gpus }}")
    assert err.value.field == "gpu_count"


def test_an_executor_the_provider_cannot_place_on(celery, monkeypatch):
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "my_company.executors.SlurmExecutor")
    with pytest.raises(InvalidSettingError, match="cannot place tasks on 'my_company.executors.SlurmExecutor'") as err:
        op(gpu_count=1)
    assert err.value.field == "backend"


def test_an_executor_that_is_not_configured(celery, monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU__EXECUTOR", "KubernetesExecutor")
    with pytest.raises(InvalidSettingError, match=r"not an executor of \[core\] executor \('CeleryExecutor'\)") as err:
        op(gpu_count=1)
    assert (err.value.field, err.value.value) == ("executor", "KubernetesExecutor")


def test_a_task_naming_no_model_goes_to_the_any_queue_and_pool(celery, monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU__QUEUE", "gpu-{accelerator}")
    monkeypatch.setenv("AIRFLOW__GPU__POOL", "{queue}")
    monkeypatch.setenv("AIRFLOW__GPU__INVENTORY", "A100=16, *=4")
    task = op(gpu_count=1)
    assert (task.queue, task.pool) == ("gpu-any", "gpu-any")
    assert pools.sizes() == {"gpu-a100": 16, "gpu-any": 4}


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"queue": "gpu queue"}, "backend_options['queue']"),
        ({"executor": ""}, "backend_options['executor']"),
        ({"kubernetes": {"namespace": "ml"}}, "backend_options['kubernetes']"),
        ({"kubernetes": "gke"}, "backend_options['kubernetes']"),
    ],
)
def test_bad_backend_options(celery, options, field):
    with pytest.raises(InvalidSettingError) as err:
        op(gpu_count=1, backend_options=options)
    assert err.value.field == field


def test_unknown_option_and_bad_kubernetes_values(celery, monkeypatch):
    with pytest.raises(UnknownSettingError, match="backend 'executor' does not support the option"):
        op(gpu_count=1, backend_options={"namespace": "ml"})
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "KubernetesExecutor")
    with pytest.raises(InvalidSettingError) as err:
        op(gpu_count=1, backend_options={"kubernetes": {"label_scheme": "azure"}})
    assert err.value.field == "backend_options['kubernetes']['label_scheme']"


def test_a_templated_accelerator_cannot_choose_a_pool_per_class(celery, monkeypatch):
    monkeypatch.setenv("AIRFLOW__GPU__POOL", "gpu-{accelerator}")
    with pytest.raises(InvalidSettingError, match="pool per worker class") as err:
        GpuStepOperator(task_id="t", command=["true"], backend="local", gpu_count=1, accelerator="{{ params.model }}")
    assert err.value.field == "accelerator"


def test_gpu_count_all_has_no_pod_form(celery, monkeypatch):
    assert op(gpu_count="all").queue == "gpu"  # Celery: every GPU of the worker, as on the local backend
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "KubernetesExecutor")
    with pytest.raises(InvalidSettingError, match="a KubernetesExecutor pod asks for a number of GPUs"):
        op(gpu_count="all")


@pytest.mark.parametrize(
    ("sizes", "failed"), [({"gpu-a100": 1}, {"a100", "h100"}), ({"gpu-a100": 2, "gpu-h100": 1}, set())]
)
def test_the_listener_fails_tasks_that_could_never_fit_in_their_classs_pool(monkeypatch, airflow_home, sizes, failed):
    from airflow.models.pool import Pool
    from airflow.utils.session import create_session
    from listeners.test_listeners import _running_dag_run

    from airflow_gpu_provider.pools.listener import fail_unschedulable_gpu_tasks

    monkeypatch.setenv("AIRFLOW__GPU__POOL", "gpu-{accelerator}")
    with create_session() as session:
        session.query(Pool).filter(Pool.pool.in_(["gpu-a100", "gpu-h100"])).delete(synchronize_session=False)
        for name, size in sizes.items():
            Pool.create_or_update_pool(name, size, "GPUs", include_deferred=False, session=session)
    with create_session() as session:
        dag_run = _running_dag_run("executor_pools", session)
        assert set(fail_unschedulable_gpu_tasks(dag_run, session)) == failed
        pools_of = {ti.task_id: (ti.pool, ti.pool_slots) for ti in dag_run.get_task_instances(session=session)}
    assert pools_of == {"a100": ("gpu-a100", 2), "h100": ("gpu-h100", 1)}


@pytest.mark.usefixtures("airflow_home")
def test_the_same_dag_runs_unchanged_under_the_local_executor(monkeypatch, state_dir):
    """LocalExecutor places nothing; at run time the executor backend is the local backend (allocator, devices)."""
    from conftest import REPO
    from helpers import load_dag, run_dag, task_states, xcom

    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")
    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", "0")
    dag_run = run_dag(load_dag(REPO / "tests" / "dags" / "executor_dags.py", "executor_gpu"))
    assert task_states(dag_run) == {"prepare": "success", "train": "success"}
    assert xcom(dag_run, "train") == {"worker": "?", "cuda_visible_devices": "0"}
