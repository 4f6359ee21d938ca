"""A pod's companions: the Secret with the task's envelope (the function's arguments are in no pod spec) and the DRA
claim template, created before the pod (or Indexed Job), owned by it, deleted after it; one that exists already is
taken only when it is that very try's own.

Rendered by the real code (KubernetesPodOperator builds the pod), and run through the real KubernetesPodOperator and
the backend's deferred pod and Job, with the cluster's answers canned (:mod:`cluster_answers`).
"""

from __future__ import annotations

import base64
import binascii
import json

import pytest
from airflow.sdk import DAG, Param
from cluster_answers import container, context, fire
from k8s_manifests import validate
from kubernetes.client import models as k8s

from airflow_gpu_provider import AccelerateOperator
from airflow_gpu_provider.backends import BACKENDS
from airflow_gpu_provider.config.worker import GpuConfig
from airflow_gpu_provider.exceptions import GpuTaskError
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.task.envelope import Envelope
from airflow_gpu_provider.task.request import TaskRequest

TOKEN = "tok-4f9a1c2e8b7d6a5f"  # a credential a template renders into the function's arguments
LABELS = {"dag_id": "d", "task_id": "train", "run_id": "manual", "try_number": "1", "map_index": "-1"}
MANAGED = {"app.kubernetes.io/managed-by": "airflow-gpu-provider"}


def login(token: str) -> str:
    return token[:3]


def _readable(obj: object) -> str:
    """Every string of an object, and what each decodes to when it is base64 (twice): what a reader of it gets."""
    found = []
    for text in json.dumps(obj).split('"'):
        found.append(text)
        for _ in range(2):
            try:
                found.append(base64.b64decode(found[-1], validate=True).decode())
            except (binascii.Error, UnicodeDecodeError, ValueError):
                break
    return "\n".join(found)


@pytest.mark.parametrize("num_machines", [1, 2])
def test_the_functions_arguments_are_in_no_pod_spec_only_in_the_tasks_secret(num_machines):
    """The token a params template renders into the arguments: not in the pod (or Job), nor base64 in it."""
    with DAG("companions", schedule=None, params={"token": Param(TOKEN, type="string")}):
        task = AccelerateOperator(
            task_id="train", python_callable=login, op_kwargs={"token": "{{ params.token }}"}, backend="kubernetes",
            num_machines=num_machines, resources=ResourceSettings(gpu_count=1), backend_options={"namespace": "ml"},
        )  # fmt: skip
    objects = [validate(obj) for obj in task.render_manifests()]
    secrets = [obj for obj in objects if obj["kind"] == "Secret"]
    assert TOKEN not in _readable([obj for obj in objects if obj["kind"] != "Secret"])
    assert [TOKEN in _readable(secret) for secret in secrets] == [True]  # it is in the Secret, the pods read it


def _deferred(kubeconfig, num_nodes=1, **options):
    request = TaskRequest(
        ResourceSettings(gpu_count=1), ImageSettings(), Envelope.run(["python3", "-c", "print(1)", TOKEN]), "fail",
        LABELS, num_nodes=num_nodes,
    )  # fmt: skip
    backend = BACKENDS["kubernetes"].create(
        {"namespace": "ml", "kubernetes_conn_id": "gke", "config_file": str(kubeconfig), "in_cluster": False, **options}
    )
    return backend, backend.plan(request, GpuConfig.read())


def test_the_companions_are_created_before_the_pod_owned_by_it_and_deleted_with_it(kubeconfig, cluster, monkeypatch):
    backend, plan = _deferred(kubeconfig, gpu_allocation="dra")  # the Secret, and the DRA claim template
    ctx = context()
    deferral = backend.start(plan, ctx)
    [pod] = cluster.created
    name = pod["metadata"]["name"]
    calls = [call for call, _ in cluster.calls]
    assert calls.index("create_namespaced_secret") < calls.index("create_namespaced_pod")
    assert calls.index("create_namespaced_resource_claim_template") < calls.index("create_namespaced_pod")
    secret, template = (
        cluster.objects[("Secret", f"{name}-envelope")],
        cluster.objects[("ResourceClaimTemplate", f"{name}-gpu")],
    )
    for made in (secret, template):
        assert made["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": f"uid-of-{name}"}
        ]
    assert secret["metadata"]["labels"]["run_id"] == "manual" and secret["immutable"] is True
    assert TOKEN in _readable(secret) and TOKEN not in _readable(pod)
    cluster.status = k8s.V1PodStatus(
        phase="Running", container_statuses=[container("base", terminated={"exit_code": 0, "reason": "Completed"}),
                                             container("airflow-xcom-sidecar", running={})],
    )  # fmt: skip
    cluster.xcom = json.dumps({"ok": True, "return_value": 1})
    backend.resume(plan, deferral.state, fire(deferral.trigger, cluster, monkeypatch), ctx)
    assert cluster.names("delete_namespaced_secret") == [f"{name}-envelope"]
    assert cluster.names("delete_namespaced_resource_claim_template") == [f"{name}-gpu"] and cluster.objects == {}


def test_a_refused_pod_leaves_no_secret(kubeconfig, cluster):
    backend, plan = _deferred(kubeconfig)
    cluster.refuse_pods = True
    with pytest.raises(Exception):  # noqa: B017 - KubernetesPodOperator's own error for the 403
        backend.start(plan, context())
    assert cluster.names("create_namespaced_secret") and cluster.objects == {}


@pytest.mark.parametrize(
    ("kind", "options", "planted"),
    [
        ("Secret", {}, {"metadata": {"labels": {"app": "mine"}}, "data": {"envelope": "cHJpbnQoJ293bmVkJyk="}}),
        ("Secret", {}, {"metadata": {"labels": {**MANAGED, **LABELS}}, "data": {"envelope": "cHJpbnQoJ293bmVkJyk="}}),
        ("Secret", {}, {"metadata": {"labels": {**MANAGED, **LABELS}}, "data": "ours"}),  # never taken, nor read
        ("ResourceClaimTemplate", {"gpu_allocation": "dra"}, {"metadata": {"labels": {"app": "mine"}}, "spec": {}}),
        ("ResourceClaimTemplate", {"gpu_allocation": "dra"}, {"metadata": {"labels": {"dag_id": "d"}}, "spec": {}}),
    ],
)
def test_one_of_that_name_that_is_not_this_trys_own_is_neither_used_nor_deleted(
    kubeconfig, cluster, kind, options, planted
):
    """Someone else's object (a Secret, or a claim template whose labels are not this try's): the task fails."""
    backend, plan = _deferred(kubeconfig, **options)
    if planted.get("data") == "ours":
        planted = {**planted, "data": {"envelope": base64.b64encode(plan.envelope.encode()).decode()}}
    cluster.planted[kind] = planted
    with pytest.raises(GpuTaskError, match=rf"A {kind} ml/.* exists already and is not this task try's own"):
        backend.start(plan, context())
    plural = {"Secret": "secret", "ResourceClaimTemplate": "resource_claim_template"}[kind]
    assert cluster.created == [] and cluster.names(f"delete_namespaced_{plural}") == []
    [name] = [name for found, name in cluster.objects if found == kind]  # still there, untouched
    assert "ownerReferences" not in cluster.objects[(kind, name)]["metadata"]
    assert list(cluster.objects) == [(kind, name)]  # what the try made before it (its Secret) is deleted


def test_a_claim_template_this_very_try_made_is_taken(kubeconfig, cluster):
    """Made by this try (the provider's labels, the try's identity): taken, and owned by the pod."""
    backend, plan = _deferred(kubeconfig, gpu_allocation="dra")
    labels = {"metadata": {"labels": {**MANAGED, **{k: v for k, v in LABELS.items() if k != "map_index"}}}}
    cluster.planted["ResourceClaimTemplate"] = {**labels, "spec": {"spec": plan.claim}}
    backend.start(plan, context())
    [pod] = cluster.created
    [name] = [name for kind, name in cluster.objects if kind == "ResourceClaimTemplate"]
    owner = cluster.objects[("ResourceClaimTemplate", name)]["metadata"]["ownerReferences"][0]
    assert owner["name"] == pod["metadata"]["name"] and cluster.names("read_namespaced_secret") == []


def test_the_indexed_job_has_one_secret_owned_by_the_job_and_deleted_with_it(kubeconfig, cluster, monkeypatch):
    backend, plan = _deferred(kubeconfig, num_nodes=2)
    deferral = backend.start(plan, context())
    [job] = cluster.jobs
    name = job["metadata"]["name"]
    secret = cluster.objects[("Secret", f"{name}-envelope")]
    assert secret["metadata"]["ownerReferences"][0] == {"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                                        "uid": "0f6c-uid"}  # fmt: skip
    assert TOKEN in _readable(secret) and TOKEN not in _readable(job)
    cluster.job_status = k8s.V1JobStatus(conditions=[k8s.V1JobCondition(type="Failed", status="True")])
    with pytest.raises(GpuTaskError):
        backend.resume(plan, deferral.state, fire(deferral.trigger, cluster, monkeypatch), context())
    assert cluster.names("delete_namespaced_secret") == [f"{name}-envelope"] and cluster.objects == {}
