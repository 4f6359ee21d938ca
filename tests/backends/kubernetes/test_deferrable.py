"""The deferrable Kubernetes backend (``deferrable=True``): ``start`` defers to the cncf provider's own
KubernetesPodTrigger, ``resume`` re-enters through KubernetesPodOperator's own ``trigger_reentry``, and a later try
takes over the earlier try's pod through the task state store (or not, with ``durable=False``).

The real KubernetesPodOperator, PodManager, hook and trigger run (the trigger to its first event, as the triggerer
runs it); only the cluster's answers are canned (:mod:`cluster_answers`: the kubernetes client's methods, the
sidecar exec, the async hook's reads). No test claims a pod ran.
"""

from __future__ import annotations

import datetime
import json

import pytest
import yaml
from airflow.providers.cncf.kubernetes.triggers.pod import KubernetesPodTrigger
from airflow.sdk import serde
from cluster_answers import (
    CONNECTION_EXTRA,
    EMPTY_XCOM,
    KUBECONFIG,
    StateStore,
    container,
    context,
    fire,
    kill,
    planned,
)
from kubernetes.client import models as k8s

from airflow_gpu_provider.backends.base import Deferral
from airflow_gpu_provider.backends.kubernetes.pod_operator import build_operator
from airflow_gpu_provider.exceptions import GpuTaskError, GpuUnavailableError, HostOutOfMemoryError, RemoteTaskError
from airflow_gpu_provider.task.result import TaskResult

POD_TRIGGER = "airflow.providers.cncf.kubernetes.triggers.pod.KubernetesPodTrigger"
SIDECAR = "airflow-xcom-sidecar"
GPU_SHORT = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: not helpful."


def started(backend, plan, cluster, ctx=None):
    """``start()``, which must defer: the Deferral, and the context it ran in."""
    ctx = ctx or context()
    deferral = backend.start(plan, ctx)
    assert isinstance(deferral, Deferral)
    return deferral, ctx


def finished(cluster, base, *, phase="Running", xcom=EMPTY_XCOM):
    """The pod as read once its main container ended (the sidecar still runs until its file is read)."""
    cluster.status = k8s.V1PodStatus(
        phase=phase, container_statuses=[container("base", **base), container(SIDECAR, running={})]
    )
    cluster.xcom = xcom


def event(deferral, status, message=""):
    """An event as KubernetesPodTrigger words it, for the one it yields only on its own failures ("error")."""
    pod = deferral.state["pod"]
    return {"status": status, "name": pod["name"], "namespace": pod["namespace"], "message": message}


def impatient(trigger):
    """The same trigger, as the triggerer builds it from its kwargs, with no time to get the pod scheduled."""
    _, kwargs = trigger.serialize()
    return KubernetesPodTrigger(**{**kwargs, "schedule_timeout": 0, "startup_check_interval": 0.01})


# ------------------------------------------------------------------ (a) the deferral
def test_start_creates_the_pod_and_defers_to_the_cncf_pod_trigger(kubeconfig, cluster):
    backend, plan = planned(kubeconfig)
    deferral, ctx = started(backend, plan, cluster)
    [created] = cluster.created
    name = created["metadata"]["name"]
    assert created["metadata"]["namespace"] == "ml"
    assert created["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert isinstance(deferral.trigger, KubernetesPodTrigger)
    classpath, kwargs = deferral.trigger.serialize()
    assert classpath == POD_TRIGGER
    assert kwargs["pod_name"] == name and kwargs["pod_namespace"] == "ml"
    assert kwargs["kubernetes_conn_id"] == "gke"
    assert kwargs["connection_extras"] == CONNECTION_EXTRA  # the connection as the worker resolved it
    assert kwargs["in_cluster"] is False
    assert kwargs["config_dict"] == yaml.safe_load(KUBECONFIG)  # the file's content: the triggerer needs no copy
    assert kwargs["cluster_context"] is None
    assert kwargs["poll_interval"] == 2
    assert kwargs["schedule_timeout"] == 120  # pending_timeout
    assert kwargs["startup_timeout"] == 900
    assert kwargs["base_container_name"] == "base"
    assert kwargs["on_finish_action"] == "delete_pod"
    assert kwargs["get_logs"] is True and kwargs["logging_interval"] == 5  # the running pod's log: next test
    assert kwargs["trigger_kwargs"] == {}  # no execution_timeout: no deadline
    assert deferral.timeout is None
    # the state: KubernetesPodOperator's re-entry, as JSON
    assert deferral.state == {
        "method": "trigger_reentry",
        "kwargs": {},
        "pod": {"name": name, "namespace": "ml"},
        "cpu_fallback": False,
    }
    assert json.loads(json.dumps(deferral.state)) == deferral.state
    # the trigger goes through Airflow's serde to the triggerer and is built again there from its kwargs
    rebuilt = KubernetesPodTrigger(**serde.deserialize(serde.serialize(kwargs)))
    assert rebuilt.serialize() == (classpath, kwargs)
    assert ctx["ti"].xcom == {"pod_name": name, "pod_namespace": "ml"}
    assert ctx["task_state_store"].values["pod_identifier"] == {"name": name, "namespace": "ml"}


def test_the_tasks_execution_timeout_becomes_the_triggers_deadline(kubeconfig, cluster):
    backend, plan = planned(kubeconfig)
    ctx = context(execution_timeout=datetime.timedelta(hours=2))
    deferral, _ = started(backend, plan, cluster, ctx)
    _, kwargs = deferral.trigger.serialize()
    deadline = kwargs["trigger_kwargs"]["_execution_deadline"]
    assert deadline == int(ctx["ti"].start_date.timestamp() + 7200)
    # KubernetesPodOperator pads Airflow's own deferral timeout, so that the trigger's timeout event comes first
    assert datetime.timedelta(seconds=7200) < deferral.timeout <= datetime.timedelta(seconds=7260)


# ------------------------------------------------------------------ (b) resume: KubernetesPodOperator's trigger_reentry
def test_resume_after_success_returns_the_value_and_deletes_the_pod(kubeconfig, cluster, monkeypatch):
    backend, plan = planned(kubeconfig)
    deferral, ctx = started(backend, plan, cluster)
    name = deferral.state["pod"]["name"]
    cluster.log = ["[gpu] 4x nvidia GPU", "epoch 1 loss 0.25"]
    envelope = {"ok": True, "return_value": {"loss": 0.25}, "profile": {"samples": 3}}
    finished(cluster, {"terminated": {"exit_code": 0, "reason": "Completed"}}, xcom=json.dumps(envelope))
    fired = fire(deferral.trigger, cluster, monkeypatch)
    assert fired["status"] == "success" and fired["name"] == name
    result = backend.resume(plan, deferral.state, fired, ctx)
    assert result == TaskResult({"loss": 0.25}, {"samples": 3})
    [log_read] = cluster.names("read_namespaced_pod_log")
    assert log_read["name"] == name and log_read["container"] == "base" and log_read["follow"] is False
    assert cluster.names("extract_xcom_json") == [name]
    assert cluster.names("delete_namespaced_pod") == [name]


def test_the_trigger_logs_a_running_pods_output_and_the_resume_only_the_rest(kubeconfig, cluster, monkeypatch, capfd):
    """KubernetesPodTrigger's own logging (``logging_interval``): while the pod runs, the trigger reads its log and
    writes its lines (the triggerer's lines are the task log's); the resume reads only what came since."""
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook

    backend, plan = planned(kubeconfig)
    deferral, ctx = started(backend, plan, cluster)
    _, kwargs = deferral.trigger.serialize()
    trigger = KubernetesPodTrigger(**{**kwargs, "logging_interval": 1, "poll_interval": 0.1})  # sooner, for the test
    cluster.status = k8s.V1PodStatus(
        phase="Running", container_statuses=[container("base", running={}), container(SIDECAR, running={})]
    )
    reads = []

    async def read_logs(_hook, name, namespace, container_name, since_seconds=None, **_):
        reads.append((name, container_name, since_seconds))
        envelope = json.dumps({"ok": True, "return_value": 1})
        finished(cluster, {"terminated": {"exit_code": 0, "reason": "Completed"}}, xcom=envelope)  # it ends after
        return ["2026-01-01T10:00:00.000000Z [gpu] 1x nvidia GPU\n", "2026-01-01T10:00:05.000000Z epoch 1 loss 0.25\n"]

    monkeypatch.setattr(AsyncKubernetesHook, "read_logs", read_logs)
    fired = fire(trigger, cluster, monkeypatch)
    assert reads == [(deferral.state["pod"]["name"], "base", None)]  # the whole log so far, while the pod ran
    logged = [line for line in capfd.readouterr().out.splitlines() if "[base] epoch 1 loss 0.25" in line]
    assert len(logged) == 1 and "AsyncPodManager" in logged[0], logged  # by the trigger
    assert fired["status"] == "success" and fired["last_log_time"] is not None
    assert backend.resume(plan, deferral.state, fired, ctx) == TaskResult(1)
    [log_read] = cluster.names("read_namespaced_pod_log")
    assert log_read["follow"] is False and log_read["since_seconds"] >= 1  # only what came after the trigger's read


def test_resume_after_the_users_exception_raises_it_with_the_pods_traceback(kubeconfig, cluster, monkeypatch):
    backend, plan = planned(kubeconfig)
    deferral, ctx = started(backend, plan, cluster)
    error = {"type": "ZeroDivisionError", "kind": "error", "message": "division by zero", "traceback": "Tb\n1/0"}
    finished(
        cluster, {"terminated": {"exit_code": 1, "reason": "Error"}}, xcom=json.dumps({"ok": False, "error": error})
    )
    fired = fire(deferral.trigger, cluster, monkeypatch)
    assert fired["status"] == "failed"
    with pytest.raises(RemoteTaskError, match="raised ZeroDivisionError in pod ml/") as raised:
        backend.resume(plan, deferral.state, fired, ctx)
    assert raised.value.error_type == "ZeroDivisionError"
    assert raised.value.remote_traceback.endswith("1/0")
    assert cluster.names("delete_namespaced_pod") == [deferral.state["pod"]["name"]]


def test_resume_after_an_oom_kill_raises_the_providers_memory_error(kubeconfig, cluster, monkeypatch):
    backend, plan = planned(kubeconfig)
    deferral, ctx = started(backend, plan, cluster)
    finished(cluster, {"terminated": {"exit_code": 137, "reason": "OOMKilled"}})  # the runtime wrote nothing
    fired = fire(deferral.trigger, cluster, monkeypatch)
    assert fired["status"] == "failed"
    with pytest.raises(HostOutOfMemoryError, match="OOMKilled") as raised:
        backend.resume(plan, deferral.state, fired, ctx)
    assert raised.value.kind == "host_oom"  # an on_oom ladder's memory step, as run() raises it
    assert "memory limit (8Gi)" in str(raised.value)
    assert cluster.names("delete_namespaced_pod") == [deferral.state["pod"]["name"]]


def test_a_timeout_on_a_pod_no_node_can_take_is_gpu_unavailable(kubeconfig, cluster, monkeypatch):
    backend, plan = planned(kubeconfig)
    deferral, ctx = started(backend, plan, cluster)
    scheduled = k8s.V1PodCondition(type="PodScheduled", status="False", reason="Unschedulable", message=GPU_SHORT)
    cluster.status = k8s.V1PodStatus(phase="Pending", conditions=[scheduled])
    fired = fire(impatient(deferral.trigger), cluster, monkeypatch)
    assert fired["status"] == "timeout" and "too long to be scheduled" in fired["message"]
    with pytest.raises(GpuUnavailableError, match="stayed Pending for 120s") as raised:
        backend.resume(plan, deferral.state, fired, ctx)
    assert "no node has 4 nvidia.com/gpu free" in str(raised.value)
    name = deferral.state["pod"]["name"]
    # marked as checked first (no later start takes it over), then deleted
    assert (name, {"metadata": {"labels": {"already_checked": "True"}}}) in cluster.names("patch_namespaced_pod")
    assert name in cluster.names("delete_namespaced_pod")


def test_a_timeout_on_a_running_pod_is_a_clear_error_and_does_not_wait_for_its_log(kubeconfig, cluster, monkeypatch):
    backend, plan = planned(kubeconfig)
    ctx = context(execution_timeout=datetime.timedelta(minutes=5))
    ctx["ti"].start_date -= datetime.timedelta(hours=1)  # the task's execution_timeout has passed
    deferral, _ = started(backend, plan, cluster, ctx)
    cluster.status = k8s.V1PodStatus(
        phase="Running", container_statuses=[container("base", running={}), container(SIDECAR, running={})]
    )
    fired = fire(deferral.trigger, cluster, monkeypatch)
    assert fired["status"] == "timeout"
    with pytest.raises(GpuTaskError, match="timed out while the task was deferred") as raised:
        backend.resume(plan, deferral.state, fired, ctx)
    assert "reached the task's execution_timeout deadline" in str(raised.value)
    [log_read] = cluster.names("read_namespaced_pod_log")
    assert log_read["follow"] is False  # following a running pod's log would wait for it to end
    assert cluster.names("delete_namespaced_pod") == [deferral.state["pod"]["name"]]


def test_an_error_event_while_the_pod_still_runs_defers_again(kubeconfig, cluster):
    backend, plan = planned(kubeconfig)
    deferral, ctx = started(backend, plan, cluster)
    cluster.status = k8s.V1PodStatus(
        phase="Running", container_statuses=[container("base", running={}), container(SIDECAR, running={})]
    )
    again = backend.resume(plan, deferral.state, event(deferral, "error", "the triggerer lost the API"), ctx)
    assert isinstance(again, Deferral) and isinstance(again.trigger, KubernetesPodTrigger)
    _, kwargs = again.trigger.serialize()
    assert kwargs["pod_name"] == deferral.state["pod"]["name"]
    assert kwargs["trigger_kwargs"] == {"_redefer_count": 1}  # KubernetesPodOperator counts its re-deferrals
    assert again.state == deferral.state
    assert cluster.names("delete_namespaced_pod") == []  # still running: nothing removed


def test_cpu_policy_defers_to_the_cpu_pod_after_no_node_took_the_gpu_pod(kubeconfig, cluster, monkeypatch):
    backend, plan = planned(kubeconfig, policy="cpu")
    deferral, ctx = started(backend, plan, cluster)
    scheduled = k8s.V1PodCondition(type="PodScheduled", status="False", reason="Unschedulable", message=GPU_SHORT)
    cluster.status = k8s.V1PodStatus(phase="Pending", conditions=[scheduled])
    fallback = backend.resume(plan, deferral.state, fire(impatient(deferral.trigger), cluster, monkeypatch), ctx)
    assert isinstance(fallback, Deferral) and fallback.state["cpu_fallback"] is True
    gpu_pod, cpu_pod = cluster.created
    assert fallback.state["pod"]["name"] == cpu_pod["metadata"]["name"] != gpu_pod["metadata"]["name"]
    assert "nvidia.com/gpu" not in cpu_pod["spec"]["containers"][0]["resources"]["limits"]
    # its resume runs the fallback's plan, made anew from the same request
    finished(cluster, {"terminated": {"exit_code": 0}}, xcom=json.dumps({"ok": True, "return_value": "cpu"}))
    fired = fire(fallback.trigger, cluster, monkeypatch)
    assert backend.resume(plan, fallback.state, fired, ctx) == TaskResult("cpu")


# ------------------------------------------------------------------ (c) reattach through the task state store
def test_a_later_try_takes_over_the_running_pod_of_an_earlier_try(kubeconfig, cluster):
    backend, plan = planned(kubeconfig)
    _, first = started(backend, plan, cluster)  # the try whose worker died after creating its pod
    [earlier] = cluster.created
    cluster.status = k8s.V1PodStatus(phase="Running", container_statuses=[container("base", running={})])
    deferral, _ = started(backend, plan, cluster, context(first["task_state_store"]))
    assert len(cluster.created) == 1  # no second pod
    assert deferral.state["pod"]["name"] == earlier["metadata"]["name"]
    assert deferral.trigger.serialize()[1]["pod_name"] == earlier["metadata"]["name"]


def test_durable_false_reaches_kubernetes_pod_operator_and_starts_afresh(kubeconfig, cluster):
    backend, plan = planned(kubeconfig, durable=False)
    assert plan.durable is False
    operator = build_operator(plan, deferrable=True)
    assert operator.reattach_on_restart is False and operator.durable is False
    assert build_operator(planned(kubeconfig)[1]).reattach_on_restart is True
    cluster.existing["train-earlier"] = {"metadata": {"name": "train-earlier", "namespace": "ml"}}
    cluster.status = k8s.V1PodStatus(phase="Running", container_statuses=[container("base", running={})])
    store = StateStore(pod_identifier={"name": "train-earlier", "namespace": "ml"})
    deferral, _ = started(backend, plan, cluster, context(store))
    assert store.reads == []  # the earlier try's pod is not even looked up
    assert cluster.names("list_namespaced_pod") == []  # nor searched by label
    [created] = cluster.created
    assert deferral.state["pod"]["name"] == created["metadata"]["name"] != "train-earlier"
    assert store.values == {"pod_identifier": {"name": "train-earlier", "namespace": "ml"}}  # not overwritten


# ------------------------------------------------------------------ (d) what the triggerer does with the pod
def test_the_trigger_logs_a_pending_pods_events_and_deletes_the_pod_when_the_task_is_stopped(
    kubeconfig, cluster, monkeypatch
):
    backend, plan = planned(kubeconfig)
    deferral, _ = started(backend, plan, cluster)
    name = deferral.state["pod"]["name"]
    cluster.pending_reads = 2  # pending for a moment: meanwhile the trigger watches the pod's events (for its log)
    finished(cluster, {"terminated": {"exit_code": 0, "reason": "Completed"}})
    _, kwargs = deferral.trigger.serialize()
    assert "log_events_on_startup" not in kwargs  # its default: the trigger logs the events of a pending pod
    watching = KubernetesPodTrigger(**{**kwargs, "startup_check_interval": 0.01})
    assert fire(watching, cluster, monkeypatch)["status"] == "success"
    assert name in cluster.names("watch_pod_events")
    kill(KubernetesPodTrigger(**kwargs), cluster, monkeypatch)  # the task was stopped while it waited (Airflow 3.3)
    assert cluster.names("delete_namespaced_pod") == [name]  # its Secret goes with it: the pod owns it
