"""Kueue admission: the queue label on the pod and the Indexed Job (created suspended), the WorkloadPriorityClass
label, the wait for admission in the task log, and the admin's objects of docs/kubernetes-admin.md.

Kueue's own names and schemas are the reference: ``tests/data/kueue/v0.19.2/`` holds its CRDs and the Go constants
that name its labels and scheduling gate (see that folder's README). The rendered objects are built by the real
KubernetesPodOperator code; the cluster's answers are canned as the API server gives them (:mod:`cluster_answers`).
No cluster, and no Kueue controller, runs here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re

import jsonschema
import pytest
import yaml
from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook
from cluster_answers import context, fire, planned
from conftest import REPO
from helpers import load_dag
from k8s_manifests import KUBERNETES_VERSIONS, validate, with_secret
from kubernetes.client import models as k8s

from airflow_gpu_provider import GpuStepOperator
from airflow_gpu_provider.backends.base import Deferral
from airflow_gpu_provider.backends.kubernetes import kueue
from airflow_gpu_provider.backends.kubernetes.multinode_run import IndexedJobRun, multinode_manifests
from airflow_gpu_provider.backends.kubernetes.pending import unschedulable
from airflow_gpu_provider.backends.kubernetes.pod_operator import build_operator
from airflow_gpu_provider.exceptions import GpuUnavailableError, InvalidSettingError

KUEUE_DATA = REPO / "tests" / "data" / "kueue" / "v0.19.2"
DAG_FILE = REPO / "tests" / "backends" / "kubernetes" / "kueue_dag.py"
VERSIONS = tuple(sorted({*KUBERNETES_VERSIONS, "1.34", "1.37"}))
GATED = "Scheduling is blocked due to non-empty scheduling gates"  # the PodScheduled message of a gated pod


def go_constant(file: str, name: str) -> str:
    """A string constant of Kueue's Go source, as released."""
    match = re.search(rf'^\s*{name}\s*=\s*"([^"]+)"', (KUEUE_DATA / file).read_text(), re.MULTILINE)
    assert match, f"{name} not in {file}"
    return match.group(1)


def crd_schema(kind: str, version: str = "v1beta2") -> dict:
    """The openAPIV3Schema of one of Kueue's CRDs, for one served version."""
    plural = kind.lower() + ("es" if kind.endswith("s") else "s")  # WorkloadPriorityClass: ...classes
    crd = yaml.safe_load((KUEUE_DATA / f"kueue.x-k8s.io_{plural}.yaml").read_text())
    [served] = [v for v in crd["spec"]["versions"] if v["name"] == version]
    assert served["served"] is True
    return served["schema"]["openAPIV3Schema"]


def kueue_section() -> str:
    text = (REPO / "docs" / "kubernetes-admin.md").read_text()
    return text.split("\n## Kueue", 1)[1].split("\n## ", 1)[0]


def docs_yaml(marker: str) -> list[dict]:
    """The YAML block that follows ``<!-- marker -->`` in the Kueue section of docs/kubernetes-admin.md."""
    block = kueue_section().split(f"<!-- {marker} -->", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    return [doc for doc in yaml.safe_load_all(block) if doc]


def contains(whole: object, part: object, path: str = "") -> None:
    """Every key and value the docs show is in the rendered object (lists item by item)."""
    if isinstance(part, dict):
        assert isinstance(whole, dict), path
        for key, value in part.items():
            assert key in whole, f"{path}.{key} is not rendered"
            contains(whole[key], value, f"{path}.{key}")
    elif isinstance(part, list):
        assert isinstance(whole, list) and len(whole) == len(part), path
        for index, (w, p) in enumerate(zip(whole, part, strict=True)):
            contains(w, p, f"{path}[{index}]")
    else:
        assert whole == part, f"{path}: docs say {part!r}, rendered {whole!r}"


@pytest.fixture(scope="module")
def rendered(airflow_home):
    dag = load_dag(DAG_FILE, "kueue_example")
    _, [pod] = with_secret(dag.get_task("fine_tune").render_manifests())
    _, [service, job] = with_secret(dag.get_task("pretrain").render_manifests())
    return pod, service, job


# ------------------------------------------------------------------ Kueue's names
def test_the_labels_and_the_gate_are_kueues_own_names():
    # kubernetes-sigs/kueue v0.19.2 pkg/controller/constants/constants.go (QueueLabel, WorkloadPriorityClassLabel)
    # and pkg/controller/jobs/pod/constants/constants.go (SchedulingGateName); documented in
    # site/content/en/docs/tasks/run/plain_pods.md and concepts/workload_priority_class.md
    assert go_constant("controller_constants.go", "QueueLabel") == kueue.QUEUE_LABEL
    assert go_constant("controller_constants.go", "WorkloadPriorityClassLabel") == kueue.PRIORITY_LABEL
    assert go_constant("pod_constants.go", "SchedulingGateName") == kueue.ADMISSION_GATE


# ------------------------------------------------------------------ what is rendered
def test_the_pod_carries_the_queue_and_priority_labels_and_no_gate(rendered):
    pod, _, _ = rendered
    validate(pod, versions=VERSIONS)  # strict schemas of every version, and the restricted profile
    labels = pod["metadata"]["labels"]
    assert labels[kueue.QUEUE_LABEL] == "team-a"
    assert labels[kueue.PRIORITY_LABEL] == "gpu-high"
    assert "schedulingGates" not in pod["spec"]  # Kueue's webhook adds its gate; a pod gated by us never runs
    assert "kueue.x-k8s.io/pod-group-name" not in labels  # one pod, no group: a multi-node run is a Job
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_the_indexed_job_is_labelled_and_created_suspended_for_kueue_to_admit(rendered):
    _, service, job = rendered
    for obj in (service, job):
        validate(obj, versions=VERSIONS)
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"][kueue.QUEUE_LABEL] == "team-a"
    assert job["metadata"]["labels"][kueue.PRIORITY_LABEL] == "gpu-high"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2  # admitted as one Workload, both pods
    assert service["metadata"]["labels"][kueue.QUEUE_LABEL] == "team-a"
    assert "schedulingGates" not in job["spec"]["template"]["spec"]
    template_labels = job["spec"]["template"]["metadata"]["labels"]  # the Job is the Workload, not each pod
    assert kueue.QUEUE_LABEL not in template_labels and kueue.PRIORITY_LABEL not in template_labels


def test_without_a_queue_nothing_of_kueue_is_rendered(kubeconfig):
    _, plan = planned(kubeconfig, num_nodes=2)
    _, _, job = multinode_manifests(plan)
    assert "suspend" not in job["spec"]
    assert not [key for key in job["metadata"]["labels"] if key.startswith("kueue.x-k8s.io/")]
    pod = build_operator(dataclasses.replace(plan, num_nodes=1)).build_pod_request_obj(None, dry_run=True)
    assert not [key for key in pod.metadata.labels if key.startswith("kueue.x-k8s.io/")]


def gke_extra(monkeypatch, **extra):
    monkeypatch.setenv("AIRFLOW_CONN_GKE", json.dumps({"conn_type": "kubernetes", "extra": extra}))


def test_the_connections_kueue_queue_is_the_default_and_the_only_unlisted_one_the_pod_may_name(kubeconfig, monkeypatch):
    """Issue 37: the cluster's queue is its connection's extra (the admin's), allowed as it is on the final pod."""
    gke_extra(monkeypatch, kueue_queue="research")
    _, plan = planned(kubeconfig)
    assert plan.kueue_queue == "research" and plan.labels[kueue.QUEUE_LABEL] == "research"
    assert plan.allowed["kueue_queue"] == {"research", "team-a"}  # team-a: the test session's allowed_objects
    _, plan = planned(kubeconfig, kueue_queue="team-a")
    assert plan.labels[kueue.QUEUE_LABEL] == "team-a"
    _, plan = planned(kubeconfig, kueue_queue="")
    assert plan.kueue_queue == "" and kueue.QUEUE_LABEL not in plan.labels
    gke_extra(monkeypatch)
    assert planned(kubeconfig)[1].allowed["kueue_queue"] == {"team-a"}


def test_the_parent_image_is_the_connections_and_a_bad_extra_is_refused_naming_the_connection(kubeconfig, monkeypatch):
    """Issue 37: the cluster's parent image is its connection's extra, else the built-in default; bad extras are
    refused before anything is submitted, naming the connection, the extra, the value and the accepted forms."""
    from airflow.exceptions import AirflowProviderDeprecationWarning

    from airflow_gpu_provider.settings.image import DEFAULT_PARENT_IMAGE

    assert planned(kubeconfig)[1].image == DEFAULT_PARENT_IMAGE
    gke_extra(monkeypatch, parent_image="nvcr.io/nvidia/pytorch:24.10-py3")
    assert planned(kubeconfig)[1].image == "nvcr.io/nvidia/pytorch:24.10-py3"
    gke_extra(monkeypatch)
    monkeypatch.setenv("AIRFLOW__GPU__DEFAULT_PARENT_IMAGE", "old/image:1")
    with pytest.warns(AirflowProviderDeprecationWarning, match="Docker or Kubernetes connection's extra parent_image"):
        assert planned(kubeconfig)[1].image == "old/image:1"
    for name, value, accepted in [("gpu_allocation", "DRA", "'device-plugin' or 'dra'"),
                                  ("parent_image", "Not An Image", "[registry/]name[:tag]")]:  # fmt: skip
        gke_extra(monkeypatch, **{name: value})
        with pytest.raises(InvalidSettingError) as raised:
            planned(kubeconfig)
        assert f"the Kubernetes connection 'gke': extra {name}={value!r} is invalid" in str(raised.value)
        assert accepted in str(raised.value)


def test_the_removed_gpu_kueue_queue_still_works_for_one_release_and_warns(kubeconfig, monkeypatch):
    from airflow.exceptions import AirflowProviderDeprecationWarning

    monkeypatch.setenv("AIRFLOW__GPU__KUEUE_QUEUE", "research")
    with pytest.warns(AirflowProviderDeprecationWarning, match="set the Kubernetes connection's extra kueue_queue"):
        _, plan = planned(kubeconfig)
    assert plan.labels[kueue.QUEUE_LABEL] == "research" and "research" in plan.allowed["kueue_queue"]


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("value", ["Team_A", "team a", "-team", "a" * 64, 7])
def test_a_queue_name_kueue_would_refuse_is_an_error_at_parse(value):
    with pytest.raises(InvalidSettingError) as raised:
        GpuStepOperator(task_id="t", command=["true"], backend="kubernetes", backend_options={"kueue_queue": value})
    text = str(raised.value)
    assert "backend_options['kueue_queue']" in text and repr(value) in text
    assert "at most 63 characters" in text and "'' for no Kueue" in text


def test_a_bad_priority_class_name_is_an_error_at_parse():
    options = {"kueue_queue": "team-a", "kueue_priority_class": "High Priority"}
    with pytest.raises(InvalidSettingError, match=r"backend_options\['kueue_priority_class'\].*'High Priority'"):
        GpuStepOperator(task_id="t", command=["true"], backend="kubernetes", backend_options=options)


def test_a_priority_class_with_no_queue_is_an_error_at_parse():
    options = {"kueue_priority_class": "gpu-high", "kueue_queue": ""}
    with pytest.raises(InvalidSettingError, match=r"backend_options\['kueue_priority_class'\].*no Kueue queue"):
        GpuStepOperator(task_id="t", command=["true"], backend="kubernetes", backend_options=options)
    # naming none, the connection's queue (read on the worker, never at parse) may give it one: accepted here
    GpuStepOperator(
        task_id="t", command=["true"], backend="kubernetes", backend_options={"kueue_priority_class": "gpu-high"}
    )


def test_a_bad_connection_queue_and_a_priority_without_queue_are_refused_before_anything_is_submitted(
    kubeconfig, monkeypatch
):
    gke_extra(monkeypatch, kueue_queue="Team_A")
    with pytest.raises(InvalidSettingError) as raised:
        planned(kubeconfig)
    assert "the Kubernetes connection 'gke': extra kueue_queue='Team_A' is invalid" in str(raised.value)
    assert "at most 63 characters" in str(raised.value)
    gke_extra(monkeypatch)
    with pytest.raises(InvalidSettingError, match=r"backend_options\['kueue_priority_class'\].*no Kueue queue"):
        planned(kubeconfig, kueue_priority_class="gpu-high")


# ------------------------------------------------------------------ waiting for admission
def gated_pod() -> dict:
    """A pod as the API server returns it while Kueue holds it (its webhook's gate and label)."""
    return {
        "kind": "Pod",
        "metadata": {
            "name": "train-x1",
            "namespace": "ml",
            "labels": {kueue.QUEUE_LABEL: "team-a", "kueue.x-k8s.io/managed": "true"},
        },
        "spec": {"schedulingGates": [{"name": kueue.ADMISSION_GATE}], "containers": [{"name": "base"}]},
        "status": {
            "phase": "Pending",
            "qosClass": "Guaranteed",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated", "message": GATED}],
        },
    }


def test_a_gated_pod_is_waiting_for_admission_not_unschedulable():
    pod = gated_pod()
    assert kueue.waiting_queue(pod) == "team-a"
    verdict = unschedulable(pod)
    assert verdict is not None and verdict.kueue_queue == "team-a" and not verdict.insufficient
    text = verdict.explain(300, {"nvidia.com/gpu": "1"})
    assert text.startswith("Pod ml/train-x1 waited 300s for Kueue admission in queue 'team-a' and was deleted")
    assert "pending_timeout" in text and "kueue_priority_class" in text
    admitted = {**pod, "spec": {"containers": [{"name": "base"}]}}  # the gate removed: the scheduler's turn
    assert kueue.waiting_queue(admitted) is None
    other_gate = {**pod, "spec": {"schedulingGates": [{"name": "example.com/other"}]}}
    assert kueue.waiting_queue(other_gate) is None


def test_a_suspended_job_waits_an_unsuspended_one_does_not():
    job = {"kind": "Job", "metadata": {"labels": {kueue.QUEUE_LABEL: "team-a"}}, "spec": {"suspend": True}}
    assert kueue.waiting_queue(job) == "team-a"
    assert kueue.waiting_queue({**job, "spec": {"suspend": False}}) is None
    assert kueue.waiting_queue({**job, "metadata": {}}) is None  # suspended by someone else: not Kueue's wait


def test_the_deferred_pod_says_it_waits_for_admission_then_times_out_as_such(kubeconfig, cluster, monkeypatch, caplog):
    cluster.kueue_webhook = True
    backend, plan = planned(kubeconfig, kueue_queue="team-a")
    ctx = context()
    with caplog.at_level(logging.INFO):
        deferral = backend.start(plan, ctx)
    assert isinstance(deferral, Deferral)  # the wait is KubernetesPodTrigger's: deferred like any pending pod
    name = deferral.state["pod"]["name"]
    assert f"Pod ml/{name} is waiting for Kueue admission in queue 'team-a'" in caplog.text
    scheduled = k8s.V1PodCondition(type="PodScheduled", status="False", reason="SchedulingGated", message=GATED)
    cluster.status = k8s.V1PodStatus(phase="Pending", conditions=[scheduled])
    _, kwargs = deferral.trigger.serialize()
    trigger = type(deferral.trigger)(**{**kwargs, "schedule_timeout": 0, "startup_check_interval": 0.01})
    fired = fire(trigger, cluster, monkeypatch)
    assert fired["status"] == "timeout"
    with pytest.raises(GpuUnavailableError, match="waited 120s for Kueue admission in queue 'team-a'"):
        backend.resume(plan, deferral.state, fired, ctx)
    assert name in cluster.names("delete_namespaced_pod")  # not left to be admitted later and run a second time


def test_the_pod_run_in_the_worker_says_it_waits_then_fails_after_pending_timeout(kubeconfig, cluster, capsys):
    cluster.kueue_webhook = True
    scheduled = k8s.V1PodCondition(type="PodScheduled", status="False", reason="SchedulingGated", message=GATED)
    cluster.status = k8s.V1PodStatus(phase="Pending", conditions=[scheduled])
    backend, plan = planned(kubeconfig, kueue_queue="team-a", pending_timeout=1)
    with pytest.raises(GpuUnavailableError, match=r"waited 1s for Kueue admission in queue 'team-a'"):
        backend.run(plan, context())
    [created] = cluster.created
    name = created["metadata"]["name"]
    assert f"Pod ml/{name} is waiting for Kueue admission in queue 'team-a'" in capsys.readouterr().out  # task log
    assert name in cluster.names("delete_namespaced_pod")


def test_without_kueue_an_unschedulable_pod_in_the_worker_is_still_the_schedulers_verdict(kubeconfig, cluster):
    # the same path (KubernetesPodOperator's PodLaunchTimeoutException, then diagnose_pending), no queue, no gate
    message = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: not helpful."
    scheduled = k8s.V1PodCondition(type="PodScheduled", status="False", reason="Unschedulable", message=message)
    cluster.status = k8s.V1PodStatus(phase="Pending", conditions=[scheduled])
    backend, plan = planned(kubeconfig, pending_timeout=1)
    with pytest.raises(
        GpuUnavailableError, match="stayed Pending for 1s and was deleted: no node has 4 nvidia.com/gpu"
    ):
        backend.run(plan, context())
    assert cluster.names("delete_namespaced_pod") == [cluster.created[0]["metadata"]["name"]]


def test_the_deferred_job_is_submitted_suspended_and_the_job_trigger_waits_through_admission(
    kubeconfig, cluster, caplog, monkeypatch
):
    backend, plan = planned(kubeconfig, num_nodes=2, kueue_queue="team-a")
    with caplog.at_level(logging.INFO):
        deferral = backend.start(plan, context())
    [job] = cluster.jobs
    assert job["spec"]["suspend"] is True and job["metadata"]["labels"][kueue.QUEUE_LABEL] == "team-a"
    assert f"Indexed Job ml/{job['metadata']['name']} is waiting for Kueue admission in queue 'team-a'" in caplog.text
    cluster.admitted = False  # Kueue has not admitted it: suspended, the Job controller's Suspended condition
    suspended = k8s.V1JobCondition(type="Suspended", status="True", reason="JobSuspended", message="Job suspended")
    cluster.job_status = k8s.V1JobStatus(conditions=[suspended])

    async def get_job_status(_hook, name, namespace):  # the triggerer's read of the Job, answered as above
        return cluster.read_namespaced_job_status(None, name, namespace)

    monkeypatch.setattr(AsyncKubernetesHook, "get_job_status", get_job_status)

    async def first_event():
        async for event in deferral.trigger.run():
            return event

    with pytest.raises(TimeoutError):  # KubernetesJobTrigger fires on Complete or Failed only: it keeps waiting
        asyncio.run(asyncio.wait_for(first_event(), timeout=1.0))
    assert cluster.names("read_namespaced_job_status") == [job["metadata"]["name"]]  # it looked, and waits on


def test_the_job_run_in_the_worker_reports_waiting_and_admission(kubeconfig, cluster, caplog):
    _, plan = planned(kubeconfig, num_nodes=2, kueue_queue="team-a")
    layout, service, job = multinode_manifests(plan)
    run = IndexedJobRun(build_operator(plan).hook, layout, service, job, log=logging.getLogger("kueue-test"))
    name = f"Job ml/{layout.name}"
    with caplog.at_level(logging.INFO, logger="kueue-test"):
        assert run._admission(job, None, 0.0) == "team-a"
        assert run._admission(job, "team-a", 10.0) == "team-a"  # said once
        admitted = {**job, "spec": {**job["spec"], "suspend": False}}
        assert run._admission(admitted, "team-a", 20.0) is None
    lines = [r.getMessage() for r in caplog.records if r.name == "kueue-test"]
    assert lines == [
        kueue.waiting_line(name, "team-a"),
        f"{name} was admitted by Kueue (queue 'team-a')",
    ]
    assert lines[0].startswith(f"{name} is waiting for Kueue admission in queue 'team-a'")


def test_a_job_never_admitted_fails_after_pending_timeout_and_is_deleted(kubeconfig, cluster, caplog):
    _, plan = planned(kubeconfig, num_nodes=2, kueue_queue="team-a")
    layout, service, job = multinode_manifests(plan)
    cluster.admitted = False
    suspended = k8s.V1JobCondition(type="Suspended", status="True", reason="JobSuspended", message="Job suspended")
    cluster.job_status = k8s.V1JobStatus(conditions=[suspended])
    hook = build_operator(plan).hook
    run = IndexedJobRun(hook, layout, service, job, log=logging.getLogger("kueue-test"), pending_timeout=0.0)
    with caplog.at_level(logging.INFO, logger="kueue-test"), pytest.raises(GpuUnavailableError) as raised:
        run.run()
    assert f"Job ml/{layout.name} waited 0s for Kueue admission in queue 'team-a' and was deleted" in str(raised.value)
    assert "is waiting for Kueue admission" in caplog.text
    assert cluster.names("delete_namespaced_job") == [layout.name]  # cleaned up: never admitted later
    assert cluster.names("delete_namespaced_service") == [layout.name]
    assert cluster.names("list_namespaced_pod")  # rank 0 was looked for (none: no pod ever ran)


# ------------------------------------------------------------------ the docs' worked example
def test_the_admins_objects_in_the_docs_validate_against_kueues_crds():
    objects = docs_yaml("kueue: admin")
    assert [o["kind"] for o in objects] == ["ResourceFlavor", "ClusterQueue", "LocalQueue", "WorkloadPriorityClass"]
    for obj in objects:
        assert obj["apiVersion"] == "kueue.x-k8s.io/v1beta2"
        jsonschema.validate(obj, crd_schema(obj["kind"]))
    flavor, cluster_queue, local_queue, priority = objects
    assert local_queue["metadata"]["name"] == "team-a" and local_queue["metadata"]["namespace"] == "ml"
    assert local_queue["spec"]["clusterQueue"] == cluster_queue["metadata"]["name"]
    assert priority["metadata"]["name"] == "gpu-high"
    [group] = cluster_queue["spec"]["resourceGroups"]
    assert "nvidia.com/gpu" in group["coveredResources"]
    assert group["flavors"][0]["name"] == flavor["metadata"]["name"]
    # the flavor's node label is the one the rendered pod selects H100 nodes by (GPU Feature Discovery)
    assert flavor["spec"]["nodeLabels"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def test_the_crd_schema_check_is_not_vacuous():
    broken = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "x"}}
    broken["spec"] = {"clusterQueue": "Not A Name"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, crd_schema("LocalQueue"))


def test_the_docs_show_what_the_code_renders(rendered):
    pod, _, job = rendered
    [shown_pod] = docs_yaml("kueue: pod")
    [shown_job] = docs_yaml("kueue: job")
    contains(pod, shown_pod)
    contains(job, shown_job)
    flavor = docs_yaml("kueue: admin")[0]
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    values = terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
    assert flavor["spec"]["nodeLabels"]["nvidia.com/gpu.product"] in values
