"""What differs between the supported Airflow versions (3.1.1 and later; README "Airflow versions").

Marked ``smoke``: `.ci/run` runs them on the oldest supported Airflow too (`make smoke-oldest`), where Airflow has no
task state store (new in 3.3). Which test runs where is decided by what the installed Airflow has, not by its number.
"""

from __future__ import annotations

import importlib.util

import pytest
from conftest import REPO
from helpers import load_dag, run_dag, task_states, xcom

from airflow_gpu_provider.escalation import tries as escalation

pytestmark = pytest.mark.smoke
HAS_STATE_STORE = importlib.util.find_spec("airflow.models.task_state_store") is not None


def test_the_cluster_policy_takes_the_arguments_this_airflow_passes():
    """Pluggy refuses a hook that asks for more than its specification, and then every ``airflow`` command fails."""
    import inspect

    import pluggy
    from airflow import policies

    from airflow_gpu_provider.pools import policy

    manager = pluggy.PluginManager(policies.local_settings_hookspec.project_name)  # as airflow.settings makes it
    manager.add_hookspecs(policies)
    manager.load_setuptools_entrypoints("airflow.policy")  # raises PluginValidationError on a mismatch
    (ours,) = [impl for impl in manager.hook.task_instance_mutation_hook.get_hookimpls() if impl.plugin is policy]
    specified = inspect.signature(policies.task_instance_mutation_hook).parameters
    assert list(inspect.signature(ours.function).parameters) == list(specified)


@pytest.mark.skipif(HAS_STATE_STORE, reason="Airflow 3.3+ climbs the ladder: tests/operators/test_oom_escalation.py")
@pytest.mark.usefixtures("airflow_home", "state_dir")
def test_without_a_task_state_store_each_try_runs_on_the_tasks_own_resources(monkeypatch, capfd, caplog):
    """Before Airflow 3.3 the history of the tries has nowhere to live: the ladder stays on its first rung."""
    monkeypatch.setenv("AIRFLOW__GPU__DEVICES", "0=L4,1=A100-80GB")
    dag_run = run_dag(load_dag(REPO / "tests" / "dags" / "escalation_dags.py", "oom_escalation"))
    assert task_states(dag_run) == {"climb": "failed"}  # both tries asked for the L4, and ran out of its memory
    out = capfd.readouterr()
    log = out.out + out.err + caplog.text  # the task log, and the provider's own log lines (dag.test runs in-process)
    assert log.count("OOM escalation GPU step 0/1, memory step 0/0: 1x nvidia L4") == 2
    assert "GPU step 1/1" not in log
    assert "no task state store (Airflow < 3.3): this try cannot know how the earlier ones ended" in log
    history = xcom(dag_run, "climb", escalation.XCOM_KEY)
    assert [t["kind"] for t in history["tries"]] == ["gpu_oom"]  # this try's own record only


def test_retry_policies_are_used_where_airflow_has_them_and_refused_clearly_where_not():
    """Airflow 3.3's retry_policy: the GPU operators' default is GpuRetryPolicy(); before it they have none, and a DAG
    that builds one is told at parse what it needs (docs/resilience.md)."""
    from airflow_gpu_provider import GpuRetryPolicy, GpuStepOperator
    from airflow_gpu_provider.exceptions import InvalidSettingError

    has_policies = importlib.util.find_spec("airflow.sdk.definitions.retry_policy") is not None
    operator = GpuStepOperator(task_id="train", command=["true"])
    if has_policies:
        assert operator.retry_policy == GpuRetryPolicy()
        return
    assert operator.retry_policy is None
    with pytest.raises(InvalidSettingError, match=r"retry policies \(retry_policy=\) are new in Airflow 3.3"):
        GpuRetryPolicy(application="fail")


def test_durable_and_start_from_trigger_are_airflows_where_it_has_them_and_degrade_where_not():
    """Airflow 3.3's durable contract and start from the triggerer: every GPU operator is a ``ResumableJobMixin``
    (Airflow's, or common-compat's stand-in that submits afresh on every try); a task that waits for GPUs starts in
    the triggerer only on 3.3 (before it, it starts on a worker and defers its wait from there)."""
    from airflow.providers.common.compat.sdk import ResumableJobMixin

    from airflow_gpu_provider import GpuStepOperator

    waits = GpuStepOperator(
        task_id="waits", command=["true"], gpu_count=1, on_missing_gpu="wait", deferrable=True, durable=True
    )
    assert isinstance(waits, ResumableJobMixin) and waits.durable is True
    assert waits.start_from_trigger is HAS_STATE_STORE  # both new in 3.3
    assert (waits.start_trigger_args is not None) is HAS_STATE_STORE
