"""GpuRetryPolicy (escalation/retry_policy.py): Airflow 3.3's retry policy, deciding by the class of a failed try.

The tries are real (``tests/failing_tries.py``): a worker runs ``tests/dags/retry_policy_dags.py`` with
``dag.test()``; an Xid 79 comes from the NVML replay through the runtime's own ctypes sampler, a collective timeout
from a real 2-process gloo group. Airflow keeps each retried try's reason in its task instance history
(``retry_reason``); a failure's reason is in the log.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from conftest import REPO
from failing_tries import GPU0, failing_run, task_instances
from helpers import load_dag

from airflow_gpu_provider import GpuRetryPolicy, GpuStepOperator
from airflow_gpu_provider.escalation.retry_policy import HAS_RETRY_POLICIES
from airflow_gpu_provider.exceptions import GpuOutOfMemoryError, InvalidSettingError

pytestmark = [
    pytest.mark.skipif(not HAS_RETRY_POLICIES, reason="retry policies are new in Airflow 3.3"),
    pytest.mark.usefixtures("airflow_home"),
]
DAG_FILE = REPO / "tests" / "dags" / "retry_policy_dags.py"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return failing_run(tmp_path_factory)


def test_an_application_error_fails_at_once_whatever_the_retries(run):
    assert run.result["states"]["bad_input"] == "failed"
    assert task_instances("bad_input") == [(1, "failed", None)]  # one try of three
    assert (
        "Retry policy decision          [task] action=fail" in run.log
        and "reason=\"application: The task raised ValueError in the local task process: bad input: 'lr' must be "
        'positive."'
        in run.log
    )


def test_an_xid_79_is_retried_and_the_reason_names_it_on_the_task_instance(run):
    assert run.result["xcom"]["gpu_fault"] == {"gpu": "1", "try": "2"}  # GPU 0 quarantined: try 2 on GPU 1
    (first, second) = task_instances("gpu_fault")
    assert first[:2] == (1, "failed") and second == (2, "success", None)  # the history keeps a retried try as failed
    assert first[2].startswith(f"infrastructure: Xid 79 on GPU 0 ({GPU0}): GPU has fallen off the bus; then the task ")
    assert first[2].endswith(")") and " (on " in first[2]  # the host


def test_a_real_gloo_collective_timeout_is_retried_as_the_infrastructures(run):
    assert run.result["xcom"]["collective_timeout"] == "ran again"
    (first, second) = task_instances("collective_timeout")
    assert first[:2] == (1, "failed") and second[:2] == (2, "success")
    assert first[2].startswith("infrastructure: ")
    assert "Timed out waiting 2000ms for recv operation to complete" in first[2]


def test_gpu_operators_retry_by_their_own_policy_when_the_dag_gives_none(run):
    dag = load_dag(DAG_FILE, "gpu_retry_policy")
    assert dag.get_task("fails_once").retry_policy == GpuRetryPolicy()
    assert dag.get_task("bad_input").retry_policy == GpuRetryPolicy(application="fail", infrastructure_delay=0)
    assert run.result["xcom"]["fails_once"] == "second try"
    (first, _) = task_instances("fails_once")
    assert first == (1, "failed", "application: The task raised KeyError in the local task process: 'checkpoint-7'.")


def test_a_policy_the_task_gives_is_kept_and_any_other_is_airflows():
    from airflow.sdk.definitions.retry_policy import ExceptionRetryPolicy

    theirs = ExceptionRetryPolicy(rules=[])
    assert GpuStepOperator(task_id="theirs", command=["true"], retry_policy=theirs).retry_policy is theirs
    assert GpuStepOperator(task_id="ours", command=["true"]).retry_policy == GpuRetryPolicy()
    assert GpuStepOperator.retry_policy is None  # the class's default, as BaseOperator's


def _echo(value):
    return value


def test_a_mapped_gpu_task_runs_with_the_default_policy_too():
    """The worker runs a mapped task's unmapped operator: built by ``__init__``, it gets ``GpuRetryPolicy()``."""
    from airflow.sdk import DAG

    with DAG("mapped_retry_policy", schedule=None):
        mapped = GpuStepOperator.partial(task_id="m", python_callable=_echo).expand(op_args=[[1], [2]])
        theirs = GpuStepOperator.partial(
            task_id="n", python_callable=_echo, retry_policy=GpuRetryPolicy(application="fail")
        )
        given = theirs.expand(op_args=[[1]])
    assert mapped.unmap({"op_args": [1], "params": {}}).retry_policy == GpuRetryPolicy()
    assert given.unmap({"op_args": [1], "params": {}}).retry_policy == GpuRetryPolicy(application="fail")


def test_it_serialises_with_the_dag():
    from airflow.serialization.serialized_objects import DagSerialization

    dag = load_dag(DAG_FILE, "gpu_retry_policy")
    tasks = {task["__var"]["task_id"]: task["__var"] for task in DagSerialization.to_dict(dag)["dag"]["tasks"]}
    assert tasks["fails_once"]["has_retry_policy"] is True
    policy = GpuRetryPolicy(application="fail", infrastructure_delay=timedelta(minutes=2))
    data = json.loads(json.dumps(policy.serialize()))
    assert data == {
        "__type": "airflow_gpu_provider.escalation.retry_policy.GpuRetryPolicy",
        "application": "fail",
        "infrastructure_delay": 120.0,
    }
    assert GpuRetryPolicy.deserialize(data) == policy


def test_an_oom_is_retried_so_that_the_next_try_climbs_and_other_errors_get_airflows_default():
    from airflow.sdk.definitions.retry_policy import RetryAction

    policy = GpuRetryPolicy(application="fail", infrastructure_delay=30)
    oom = GpuOutOfMemoryError("The task ran out of GPU memory in pod ml/train (OutOfMemoryError: CUDA out of memory).")
    decision = policy.evaluate(oom, try_number=1, max_tries=3)
    assert decision.action == RetryAction.RETRY and decision.retry_delay is None
    assert (
        decision.reason
        == "resources: The task ran out of GPU memory in pod ml/train (OutOfMemoryError: CUDA out of memory)."
    )
    assert policy.evaluate(ConnectionError("engine gone"), 1, 3).action == RetryAction.DEFAULT


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"application": "ignore"}, "application='ignore' is invalid: unknown value. Accepted: 'retry' or 'fail'"),
        ({"infrastructure_delay": -5}, "infrastructure_delay=-5 is invalid: not a delay"),
        ({"infrastructure_delay": "1m"}, "infrastructure_delay='1m' is invalid"),
    ],
)
def test_bad_options_are_refused_naming_the_field(options, message):
    with pytest.raises(InvalidSettingError, match=message.replace("(", r"\(").replace(")", r"\)")):
        GpuRetryPolicy(**options)


def test_the_last_try_gets_airflows_default_and_logs_no_retry():
    """A task without retries (or on its last try): no ``Retry policy decision action=retry`` line."""
    from airflow.sdk.definitions.retry_policy import RetryAction

    oom = GpuOutOfMemoryError("The task ran out of GPU memory in the local task process.")
    last = GpuRetryPolicy().evaluate(oom, try_number=1, max_tries=0)
    assert last.action == RetryAction.DEFAULT and not last.reason
    assert GpuRetryPolicy().evaluate(oom, try_number=3, max_tries=2).action == RetryAction.DEFAULT
    assert GpuRetryPolicy().evaluate(oom, try_number=2, max_tries=2).action == RetryAction.RETRY
