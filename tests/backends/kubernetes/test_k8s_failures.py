"""Infrastructure failures on Kubernetes: pod statuses as the API server returns them -> the ``gpu_failure`` record,
the typed error, and the next try's node anti-affinity (read back from the task state store at its render).

The statuses are the API's own shapes and wordings (kubelet's eviction message, kube-scheduler's preemption, the taint
manager's and PodGC's DisruptionTarget reasons, the kubelet's image pull error); the backend runs for real against
the canned answers of :mod:`cluster_answers` (no cluster can be had here).
"""

from __future__ import annotations

import logging

import pytest
from airflow.providers.cncf.kubernetes.triggers.pod import KubernetesPodTrigger
from cluster_answers import StateStore, context, fire, planned
from k8s_manifests import main_container, plan_and_render, validate
from kubernetes.client import models as k8s

from airflow_gpu_provider.backends.kubernetes.failures import pod_failure
from airflow_gpu_provider.escalation import infrastructure
from airflow_gpu_provider.exceptions import GpuInfrastructureError, GpuUnavailableError
from airflow_gpu_provider.settings import ResourceSettings

NODE = "gke-ml-a100-pool-3f1c9b2e-x7kq"
EVICTED_MESSAGE = (
    "The node was low on resource: memory. Threshold quantity: 100Mi, available: 94572Ki. Container base was using "
    "7890612Ki, request is 8Gi, has larger consumption of memory. "
)


def pod(status: dict, node: str | None = NODE) -> dict:
    return {
        "metadata": {"name": "d-train-abc123", "namespace": "ml"},
        "spec": {"nodeName": node, "containers": [{"name": "base", "image": "registry.example.com/train:v9"}]},
        "status": status,
    }


def disruption(reason: str, message: str, phase: str = "Running") -> dict:
    condition = {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message}
    return {"phase": phase, "conditions": [condition, {"type": "Ready", "status": "False"}]}


KILLED = {
    "terminated": {
        "exitCode": 137,
        "reason": "ContainerStatusUnknown",
        "message": "The container could not be located when the pod was terminated",
    }
}
EVICTED = {  # what the kubelet leaves of a pod it evicted for node pressure (Kubernetes 1.26+)
    "phase": "Failed",
    "reason": "Evicted",
    "message": EVICTED_MESSAGE,
    "conditions": [
        {"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet", "message": EVICTED_MESSAGE}
    ],
    "containerStatuses": [
        {"name": name, "image": "x", "imageID": "", "ready": False, "restartCount": 0, "state": KILLED}
        for name in ("base", "airflow-xcom-sidecar")
    ],
}
IMAGE_PULL = {
    "phase": "Pending",
    "conditions": [{"type": "PodScheduled", "status": "True"}],
    "containerStatuses": [
        {
            "name": "base",
            "image": "registry.example.com/train:v9",
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "state": {
                "waiting": {
                    "reason": "ErrImagePull",
                    "message": 'rpc error: code = NotFound desc = failed to pull and unpack image "registry.example.'
                    'com/train:v9": failed to resolve reference "registry.example.com/train:v9": not found',
                }
            },
        }
    ],
}


@pytest.mark.parametrize(
    ("status", "reason", "evidence"),
    [
        (EVICTED, "evicted", "Evicted: The node was low on resource: memory."),
        (
            disruption("PreemptionByScheduler", "default-scheduler: preempting to accommodate a higher priority pod"),
            "preempted by the scheduler for a pod of higher priority",
            "DisruptionTarget PreemptionByScheduler: default-scheduler: preempting",
        ),
        (
            disruption("DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint"),
            "lost with its node (the node became unreachable or not ready)",
            "Taint manager: deleting due to NoExecute taint",
        ),
        (
            disruption("DeletionByPodGC", "PodGC: node no longer exists", phase="Failed"),
            "lost with its node (the node no longer exists)",
            "PodGC: node no longer exists",
        ),
        (
            {
                "phase": "Unknown",
                "reason": "NodeLost",
                "message": f"Node {NODE} which was running pod d-train-abc123 is unresponsive",
            },
            "lost with its node",
            "NodeLost: Node",
        ),
        (IMAGE_PULL, "the image cannot be pulled", "ErrImagePull for image registry.example.com/train:v9"),
    ],
    ids=["evicted", "preempted", "node unreachable", "node deleted", "node lost (older clusters)", "ErrImagePull"],
)
def test_pod_statuses_of_the_clusters_doing_are_infrastructure(status, reason, evidence):
    failure = pod_failure(pod(status))
    assert failure is not None
    assert failure["class"] == "infrastructure" and failure["reason"] == reason
    assert failure["node"] == NODE and failure["gpus"] == []
    [line] = failure["evidence"]
    assert line.startswith("pod ml/d-train-abc123: ") and evidence in line


@pytest.mark.parametrize(
    "status",
    [
        {
            "phase": "Failed",
            "containerStatuses": [{"name": "base", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}],
        },
        {
            "phase": "Failed",
            "containerStatuses": [{"name": "base", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}],
        },
        {"phase": "Running", "conditions": [{"type": "DisruptionTarget", "status": "False"}]},
        {
            "phase": "Pending",
            "containerStatuses": [{"name": "base", "state": {"waiting": {"reason": "ContainerCreating"}}}],
        },
    ],
    ids=["the task's error", "OOMKilled (resources)", "no disruption", "still creating"],
)
def test_other_ends_are_not_the_infrastructures(status):
    assert pod_failure(pod(status)) is None


def test_an_evicted_pod_raises_the_infrastructure_error_with_its_node(kubeconfig, cluster, monkeypatch):
    backend, plan = planned(kubeconfig)
    ctx = context()
    deferral = backend.start(plan, ctx)
    cluster.created[0]["spec"]["nodeName"] = NODE  # where the scheduler put it
    cluster.status = to_status(EVICTED)
    fired = fire(deferral.trigger, cluster, monkeypatch)
    assert fired["status"] == "failed"
    with pytest.raises(GpuInfrastructureError, match="failed because of the cluster, not the task: evicted") as err:
        backend.resume(plan, deferral.state, fired, ctx)
    assert err.value.failure["node"] == NODE and err.value.failure["reason"] == "evicted"
    assert cluster.names("delete_namespaced_pod") == [deferral.state["pod"]["name"]]


def test_an_image_that_cannot_be_pulled_is_the_infrastructures(kubeconfig, cluster):
    backend, plan = planned(kubeconfig)
    cluster.status = to_status(IMAGE_PULL)
    with pytest.raises(GpuInfrastructureError, match="the image cannot be pulled") as err:
        backend.run(plan, context())
    assert "ErrImagePull for image registry.example.com/train:v9" in err.value.failure["evidence"][0]


def test_a_pod_no_node_took_in_time_says_so_without_a_node_to_avoid(kubeconfig, cluster, monkeypatch):
    backend, plan = planned(kubeconfig)
    ctx = context()
    deferral = backend.start(plan, ctx)
    scheduled = k8s.V1PodCondition(
        type="PodScheduled",
        status="False",
        reason="Unschedulable",
        message="0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: not helpful.",
    )
    cluster.status = k8s.V1PodStatus(phase="Pending", conditions=[scheduled])
    _, kwargs = deferral.trigger.serialize()  # the trigger as the triggerer builds it, with no time to wait
    impatient = KubernetesPodTrigger(**{**kwargs, "schedule_timeout": 0, "startup_check_interval": 0.01})
    fired = fire(impatient, cluster, monkeypatch)
    with pytest.raises(GpuUnavailableError, match="stayed Pending") as err:
        backend.resume(plan, deferral.state, fired, ctx)
    assert err.value.failure is not None and err.value.failure["class"] == "infrastructure"
    assert err.value.failure["reason"] == "no node could take the pod in time" and err.value.failure["node"] is None


def to_status(status: dict) -> k8s.V1PodStatus:
    from airflow_gpu_provider.backends.kubernetes.pod_operator import to_model

    return to_model(status, "V1PodStatus")


def test_the_next_try_renders_a_required_anti_affinity_for_the_failed_nodes(caplog):
    """report() (as the operator calls it) -> the task state store -> avoided_nodes() -> the next try's pod."""
    store = StateStore()
    ctx = context(store)
    log = logging.getLogger("task")
    for node in (NODE, "gke-ml-a100-pool-3f1c9b2e-m2pd", NODE):  # the same node twice is kept once, latest last
        failure = pod_failure(pod(EVICTED, node))
        with caplog.at_level(logging.ERROR, logger="task"):
            infrastructure.report(ctx, failure, log, avoid_node=True)
    assert ctx["ti"].xcom["gpu_failure"] == failure  # the latest
    assert f"[gpu] infrastructure failure: evicted on {NODE}: pod ml/d-train-abc123: Evicted: " in caplog.text
    avoided = infrastructure.avoided_nodes(ctx)
    assert avoided == ("gke-ml-a100-pool-3f1c9b2e-m2pd", NODE)
    _, [rendered] = plan_and_render(
        ResourceSettings(gpu_count=1, accelerator="A100-80GB"), options={"pending_timeout": 60}, avoid_nodes=avoided
    )
    for version in ("1.34", "1.37"):
        validate(rendered, versions=(version,))
    terms = rendered["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    for term in terms["nodeSelectorTerms"]:  # ANDed into every term, next to the accelerator's expression
        assert {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": list(avoided)} in term[
            "matchExpressions"
        ]
    assert main_container(rendered)["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_what_is_read_back_from_the_store_is_checked():
    store = StateStore(**{infrastructure.KEY: ["good-node", "../etc", 7, "UPPER"]})
    assert infrastructure.avoided_nodes(context(store)) == ("good-node",)
    assert infrastructure.avoided_nodes(context(StateStore(**{infrastructure.KEY: "a-node"}))) == ()


def test_a_multi_node_jobs_pods_avoid_the_failed_nodes_too():
    _, rendered = plan_and_render(
        ResourceSettings(gpu_count=1), options={"pending_timeout": 60}, avoid_nodes=(NODE,), num_nodes=2
    )
    [job] = [obj for obj in rendered if obj["kind"] == "Job"]
    terms = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [NODE]}]}
    ]


def test_the_worked_example_of_the_docs_is_what_the_code_renders():
    """docs/kubernetes.md, "GPU failure classes": the record, the log line and the next pod's affinity."""
    import json
    import re
    from pathlib import Path

    import yaml

    docs = (Path(__file__).resolve().parents[3] / "docs" / "kubernetes.md").read_text()
    section = docs[docs.index("## GPU failure classes") :]
    record, affinity = (
        re.findall(r"```json\n(.*?)```", section, re.S)[0],
        re.findall(r"```yaml\n(.*?)```", section, re.S)[0],
    )
    message = "default-scheduler: preempting to accommodate a higher priority pod"
    preempted = {
        "metadata": {"name": "train-h2qloq0t", "namespace": "ml"},
        "spec": {"nodeName": NODE},
        "status": disruption("PreemptionByScheduler", message),
    }
    failure = pod_failure(preempted)
    assert json.loads(record) == failure
    assert infrastructure.describe(failure) in section
    _, [rendered] = plan_and_render(
        ResourceSettings(gpu_count=1, accelerator="A100-80GB"), options={"pending_timeout": 60}, avoid_nodes=(NODE,)
    )
    assert yaml.safe_load(affinity) == {"affinity": rendered["spec"]["affinity"]}


def test_a_backend_without_nodes_keeps_none():
    """Local and Docker: the "node" of a failure is the worker or a container; nothing goes to the store."""
    store = StateStore()
    ctx = context(store)
    infrastructure.report(ctx, pod_failure(pod(EVICTED)), logging.getLogger("task"), avoid_node=False)
    assert store.values == {} and ctx["ti"].xcom["gpu_failure"]["node"] == NODE
