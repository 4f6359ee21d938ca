"""The deferrable multi-node run: the Indexed Job and its Service submitted, the wait handed to the cncf provider's
KubernetesJobTrigger (run here to its first event, as the triggerer runs it), rank 0's result collected on resume
and everything deleted on every path. Only the cluster's answers are canned (:mod:`cluster_answers`).
"""

from __future__ import annotations

import datetime
import json

import pytest
from airflow.providers.cncf.kubernetes.triggers.job import KubernetesJobTrigger
from cluster_answers import (
    StateStore,
    container,
    context,
    fire,
    planned,
)
from k8s_manifests import validate
from kubernetes.client import models as k8s

from airflow_gpu_provider.backends.base import Deferral
from airflow_gpu_provider.backends.kubernetes.multinode import COMPLETION_INDEX, JOB_LABEL
from airflow_gpu_provider.backends.kubernetes.multinode_defer import JOB_STATE_KEY
from airflow_gpu_provider.exceptions import GpuTaskError, HostOutOfMemoryError, RemoteTaskError
from airflow_gpu_provider.runtime.protocol import RESULT_MARKER
from airflow_gpu_provider.task.result import TaskResult

JOB_TRIGGER = "airflow.providers.cncf.kubernetes.triggers.job.KubernetesJobTrigger"


def started(kubeconfig, cluster, ctx=None, **kwargs):
    backend, plan = planned(kubeconfig, num_nodes=2, **kwargs)
    ctx = ctx or context()
    deferral = backend.start(plan, ctx)
    assert isinstance(deferral, Deferral)
    return backend, plan, deferral, ctx


def ranks(name, rank1=None):
    """The Job's two pods as listed: rank 0 done, rank 1 as given (done by default)."""
    done = {"terminated": {"exit_code": 0, "reason": "Completed"}}
    return [
        k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(
                name=f"{name}-{rank}-x7k2p", namespace="ml", annotations={COMPLETION_INDEX: str(rank)}
            ),
            spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="base")]),
            status=k8s.V1PodStatus(phase="Failed", container_statuses=[container("base", **state)]),
        )
        for rank, state in ((0, done), (1, rank1 or done))
    ]


def job_over(cluster, name, condition, reason=None, rank1=None, result=None):
    cluster.job_status = k8s.V1JobStatus(conditions=[k8s.V1JobCondition(type=condition, status="True", reason=reason)])
    cluster.job_pods = ranks(name, rank1)
    cluster.log = ["rank 0 epoch 1", *([RESULT_MARKER + json.dumps(result)] if result else [])]


def cleaned_up(cluster, name):
    return (
        cluster.names("delete_namespaced_job") == [name]
        and cluster.names("delete_collection_namespaced_pod") == [f"{JOB_LABEL}={name}"]
        and cluster.names("delete_namespaced_service") == [name]
    )


def test_start_submits_the_job_and_its_service_and_defers_to_the_cncf_job_trigger(kubeconfig, cluster):
    _, _, deferral, ctx = started(kubeconfig, cluster)
    [job] = cluster.jobs
    name = job["metadata"]["name"]
    validate(job)
    assert job["spec"]["completions"] == 2 and job["spec"]["completionMode"] == "Indexed"
    assert "activeDeadlineSeconds" not in job["spec"]  # no execution_timeout
    [service] = cluster.names("create_namespaced_service")
    assert service["metadata"]["ownerReferences"][0]["uid"] == "0f6c-uid"  # it goes with the Job
    assert isinstance(deferral.trigger, KubernetesJobTrigger)
    classpath, kwargs = deferral.trigger.serialize()
    assert classpath == JOB_TRIGGER
    assert kwargs == {
        "job_name": name,
        "job_namespace": "ml",
        "pod_names": [],
        "pod_namespace": "ml",
        "base_container_name": "base",
        "kubernetes_conn_id": "gke",
        "poll_interval": 5.0,
        "cluster_context": None,
        "config_file": str(kubeconfig),  # read on the triggerer: the same path must exist there
        "in_cluster": False,
        "get_logs": False,
        "do_xcom_push": False,
    }
    assert deferral.state == {"job": {"name": name, "namespace": "ml"}}
    assert json.loads(json.dumps(deferral.state)) == deferral.state
    assert deferral.timeout is None
    assert ctx["task_state_store"].values[JOB_STATE_KEY] == {"name": name, "namespace": "ml"}


def test_the_tasks_execution_timeout_becomes_the_jobs_deadline(kubeconfig, cluster):
    ctx = context(execution_timeout=datetime.timedelta(hours=3))
    _, _, deferral, _ = started(kubeconfig, cluster, ctx)
    [job] = cluster.jobs
    assert 10790 <= job["spec"]["activeDeadlineSeconds"] <= 10800
    validate(job)
    assert deferral.timeout == datetime.timedelta(seconds=job["spec"]["activeDeadlineSeconds"] + 120)


def test_resume_after_success_returns_rank_zeros_value_and_deletes_everything(kubeconfig, cluster, monkeypatch):
    backend, plan, deferral, ctx = started(kubeconfig, cluster)
    name = deferral.state["job"]["name"]
    job_over(cluster, name, "Complete", result={"ok": True, "return_value": [0.25, 0.5]})
    fired = fire(deferral.trigger, cluster, monkeypatch)
    assert fired["status"] == "success" and fired["name"] == name
    assert backend.resume(plan, deferral.state, fired, ctx) == TaskResult([0.25, 0.5])
    assert cluster.names("fetch_container_logs") == [(f"{name}-0-x7k2p", "base", False)]  # rank 0's log, copied
    assert cleaned_up(cluster, name)


def test_resume_after_rank_zeros_exception_raises_it(kubeconfig, cluster, monkeypatch):
    backend, plan, deferral, ctx = started(kubeconfig, cluster)
    name = deferral.state["job"]["name"]
    error = {"type": "ValueError", "kind": "error", "message": "bad shard", "traceback": "Tb\nValueError"}
    job_over(cluster, name, "Failed", "BackoffLimitExceeded", result={"ok": False, "error": error})
    fired = fire(deferral.trigger, cluster, monkeypatch)
    assert fired["status"] == "error"
    with pytest.raises(RemoteTaskError, match=f"raised ValueError in Job {name}"):
        backend.resume(plan, deferral.state, fired, ctx)
    assert cleaned_up(cluster, name)


def test_resume_after_a_rank_was_oom_killed_raises_the_providers_memory_error(kubeconfig, cluster, monkeypatch):
    backend, plan, deferral, ctx = started(kubeconfig, cluster)
    name = deferral.state["job"]["name"]
    job_over(
        cluster, name, "Failed", "BackoffLimitExceeded", rank1={"terminated": {"exit_code": 137, "reason": "OOMKilled"}}
    )
    fired = fire(deferral.trigger, cluster, monkeypatch)
    with pytest.raises(HostOutOfMemoryError, match=f"pod ml/{name}-1-x7k2p was stopped: OOMKilled") as raised:
        backend.resume(plan, deferral.state, fired, ctx)
    assert "memory limit (8Gi)" in str(raised.value)
    assert cleaned_up(cluster, name)


def test_resume_after_the_jobs_deadline_names_the_execution_timeout(kubeconfig, cluster, monkeypatch):
    backend, plan, deferral, ctx = started(kubeconfig, cluster, context(execution_timeout=datetime.timedelta(hours=1)))
    name = deferral.state["job"]["name"]
    job_over(cluster, name, "Failed", "DeadlineExceeded", rank1={"terminated": {"exit_code": 143, "reason": "Error"}})
    fired = fire(deferral.trigger, cluster, monkeypatch)
    with pytest.raises(GpuTaskError, match="DeadlineExceeded .the task's execution_timeout"):
        backend.resume(plan, deferral.state, fired, ctx)
    assert cleaned_up(cluster, name)


def earlier_job(kubeconfig, cluster, ctx, **labels):
    """An earlier try's Job, running, with this task instance's labels (and ``labels``)."""
    from airflow_gpu_provider.backends.kubernetes.multinode_run import multinode_manifests

    _, plan = planned(kubeconfig, num_nodes=2)
    cluster.earlier_labels = {**multinode_manifests(plan, context=ctx)[2]["metadata"]["labels"], **labels}
    cluster.job_status = k8s.V1JobStatus(active=2)  # still running


def test_a_later_try_takes_over_the_running_job_of_an_earlier_try(kubeconfig, cluster):
    store = StateStore(**{JOB_STATE_KEY: {"name": "train-earlier", "namespace": "ml"}})
    earlier_job(kubeconfig, cluster, context(store))
    _, _, deferral, _ = started(kubeconfig, cluster, context(store))
    assert cluster.jobs == []  # no second Job
    assert deferral.trigger.serialize()[1]["job_name"] == "train-earlier"
    assert deferral.state == {"job": {"name": "train-earlier", "namespace": "ml"}}


def test_a_recorded_job_of_another_task_or_namespace_is_neither_taken_nor_deleted(kubeconfig, cluster):
    """Issue 34, low: the record is data the task's own code can write; a Job it names in another namespace, or
    without this task instance's labels, was taken over (and deleted once over). A new Job is submitted instead.
    """
    for recorded, labels in (("ml-other", {}), ("ml", {"dag_id": "another-dag"})):
        store = StateStore(**{JOB_STATE_KEY: {"name": "victim", "namespace": recorded}})
        earlier_job(kubeconfig, cluster, context(store), **labels)
        cluster.job_status = k8s.V1JobStatus(conditions=[k8s.V1JobCondition(type="Complete", status="True")])
        _, _, deferral, _ = started(kubeconfig, cluster, context(store))
        assert deferral.state["job"]["name"] != "victim"
        assert "victim" not in cluster.names("delete_namespaced_job")


def test_an_earlier_tries_finished_job_is_removed_and_a_new_one_submitted(kubeconfig, cluster):
    store = StateStore(**{JOB_STATE_KEY: {"name": "train-earlier", "namespace": "ml"}})
    earlier_job(kubeconfig, cluster, context(store))
    cluster.job_status = k8s.V1JobStatus(conditions=[k8s.V1JobCondition(type="Complete", status="True")])
    _, _, deferral, _ = started(kubeconfig, cluster, context(store))
    assert cleaned_up(cluster, "train-earlier")
    [job] = cluster.jobs
    assert deferral.state["job"]["name"] == job["metadata"]["name"] != "train-earlier"


def test_durable_false_never_looks_for_an_earlier_job(kubeconfig, cluster):
    store = StateStore(**{JOB_STATE_KEY: {"name": "train-earlier", "namespace": "ml"}})
    cluster.job_status = k8s.V1JobStatus(active=2)
    _, _, deferral, _ = started(kubeconfig, cluster, context(store), durable=False)
    assert store.reads == [] and cluster.names("read_namespaced_job_status") == []
    [job] = cluster.jobs
    assert deferral.state["job"]["name"] == job["metadata"]["name"]
    assert store.values[JOB_STATE_KEY] == {"name": "train-earlier", "namespace": "ml"}  # not overwritten
