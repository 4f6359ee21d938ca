"""``deferrable``, ``durable`` and ``wait_timeout`` when the DAG is parsed: accepted where they mean something.

``deferrable``'s default is Airflow's ``[operators] default_deferrable``; ``reattach`` (``durable``'s name before) and
``[gpu] deferrable`` are still read for one release, each with a deprecation warning at the DAG line.
"""

from __future__ import annotations

import datetime

import pytest
from airflow.exceptions import AirflowProviderDeprecationWarning

from airflow_gpu_provider import AccelerateOperator, GpuStepOperator, gpu_task
from airflow_gpu_provider.exceptions import InvalidSettingError


def work() -> int:
    return 1


def test_local_refuses_a_deferred_run_naming_the_field_and_the_choices():
    with pytest.raises(InvalidSettingError) as raised:
        GpuStepOperator(task_id="t", python_callable=work, backend="local", deferrable=True)
    message = str(raised.value)
    assert "deferrable=True" in message and "'local' backend runs the task as a child of its worker" in message
    assert "backend='docker', 'kubernetes' or 'ray'" in message and "on_missing_gpu='wait'" in message


def test_the_executor_backend_refuses_it_too():
    with pytest.raises(InvalidSettingError, match="'executor' backend"):
        GpuStepOperator(task_id="t", python_callable=work, backend="executor", deferrable=True)


def test_local_defers_the_wait_for_gpus():
    task = GpuStepOperator(task_id="t", python_callable=work, backend="local", on_missing_gpu="wait", deferrable=True)
    assert task.deferrable is True


def test_a_wait_starts_in_the_triggerer_where_its_trigger_can_run_on_the_gpu_host(monkeypatch):
    """``start_from_trigger`` (tests/executors/test_start_from_trigger.py runs it): for a settled wait on a host
    allocator's GPUs, without trigger queues (Airflow's start trigger has none); else the wait defers from a worker.
    """
    waits = {"python_callable": work, "gpu_count": 1, "on_missing_gpu": "wait", "deferrable": True}
    task = GpuStepOperator(task_id="t", backend="local", wait_timeout=30, **waits)
    assert task.start_from_trigger is True and task.start_trigger_args is not None
    assert task.start_trigger_args.trigger_cls == "airflow_gpu_provider.host.trigger.GpuStartTrigger"
    assert task.start_trigger_args.trigger_kwargs["limit"] == 30
    assert task.start_trigger_args.next_method == "execute_complete"
    assert GpuStepOperator(task_id="d", backend="docker", **waits).start_from_trigger is True
    monkeypatch.setenv(
        "AIRFLOW__GPU_POLICY__ALLOWED_CLUSTERS", "docker=unix://var/run/docker.sock, docker=tcp://gpu:2376"
    )
    remote = GpuStepOperator(task_id="r", backend="docker", backend_options={"docker_url": "tcp://gpu:2376"}, **waits)
    kubernetes = GpuStepOperator(task_id="k", backend="kubernetes", **waits)
    templated = GpuStepOperator(task_id="m", backend="local", **{**waits, "gpu_count": "{{ params.gpus }}"})
    no_gpu = GpuStepOperator(task_id="c", backend="local", **{**waits, "gpu_count": 0})
    assert [t.start_from_trigger for t in (remote, kubernetes, templated, no_gpu)] == [False] * 4
    monkeypatch.setenv("AIRFLOW__TRIGGERER__QUEUES_ENABLED", "True")
    assert GpuStepOperator(task_id="q", backend="local", **waits).start_from_trigger is False


@pytest.mark.parametrize("backend", ["docker", "kubernetes"])
def test_docker_and_kubernetes_defer(backend):
    assert GpuStepOperator(task_id="t", python_callable=work, backend=backend, deferrable=True).deferrable


def test_accelerate_and_the_decorator_take_it():
    launch = AccelerateOperator(task_id="a", python_callable=work, backend="docker", deferrable=True)
    assert launch.deferrable and launch.durable

    @gpu_task(backend="docker", deferrable=True, durable=False, wait_timeout=datetime.timedelta(minutes=5))
    def decorated() -> int:
        return 1

    from airflow.sdk import DAG

    with DAG("d", schedule=None):
        task = decorated().operator
    assert task.deferrable and not task.durable and task.wait_timeout == 300.0


def test_the_default_is_airflows_default_deferrable(monkeypatch):
    """As KubernetesPodOperator's: ``[operators] default_deferrable``; where only a wait could be deferred (the local
    backend) the default defers that and runs the task in its worker, where ``deferrable=True`` is refused."""
    assert not GpuStepOperator(task_id="t", python_callable=work, backend="docker").deferrable
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "True")
    assert GpuStepOperator(task_id="t", python_callable=work, backend="docker").deferrable
    local = GpuStepOperator(task_id="t", python_callable=work, backend="local")
    assert local.deferrable  # a wait for GPUs would be deferred; the run stays in the worker
    assert not GpuStepOperator(task_id="t", python_callable=work, backend="local", deferrable=False).deferrable


def test_gpu_deferrable_is_read_for_one_more_release_with_a_warning(monkeypatch):
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", "False")
    monkeypatch.setenv("AIRFLOW__GPU__DEFERRABLE", "True")
    with pytest.warns(AirflowProviderDeprecationWarning, match=r"\[gpu\] deferrable='True' is deprecated") as seen:
        task = GpuStepOperator(task_id="t", python_callable=work, backend="docker")
    assert task.deferrable
    assert seen[0].filename == __file__ and str(seen[0].message).startswith("GpuStepOperator('t'): ")


def test_reattach_is_durables_old_name_with_a_warning_at_the_dag_line():
    deprecated = "reattach=False is deprecated: write durable=False"
    with pytest.warns(AirflowProviderDeprecationWarning, match=deprecated) as seen:
        task = GpuStepOperator(task_id="t", python_callable=work, backend="docker", reattach=False)
    assert task.durable is False
    assert seen[0].filename == __file__ and str(seen[0].message).startswith("GpuStepOperator('t'): ")
    with pytest.raises(InvalidSettingError, match="reattach=False is invalid: it contradicts durable=True"):
        GpuStepOperator(task_id="t", python_callable=work, backend="docker", reattach=False, durable=True)


@pytest.mark.parametrize(
    ("argument", "value", "accepted"),
    [
        ("deferrable", "yes", "True or False"),
        ("durable", 1, "True or False"),
        ("reattach", 1, "True or False"),
        ("wait_timeout", 0, "seconds (at most 1e9) or a timedelta"),
        ("wait_timeout", float("nan"), "seconds (at most 1e9) or a timedelta"),
        ("wait_timeout", "1h", "seconds (at most 1e9) or a timedelta"),
    ],
)
def test_bad_values_name_the_field_the_value_and_the_accepted_forms(argument, value, accepted):
    with pytest.raises(InvalidSettingError) as raised:
        GpuStepOperator(task_id="t", python_callable=work, backend="docker", **{argument: value})
    assert argument in str(raised.value) and repr(value) in str(raised.value) and accepted in str(raised.value)


def test_a_templated_backend_is_checked_when_it_is_rendered():
    task = GpuStepOperator(task_id="t", python_callable=work, backend="{{ params.backend }}", deferrable=True)
    task.backend = "local"  # as rendered; execute() checks the rendered spec before anything starts
    with pytest.raises(InvalidSettingError, match="deferrable"):
        task.rendered_spec()
