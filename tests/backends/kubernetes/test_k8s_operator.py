"""The plan -> GpuPodOperator (a KubernetesPodOperator), and how a failed run becomes a typed error.

The failure cases feed the operator the objects the API server would have returned (real kubernetes client model
objects holding real status data); no client call is made and nothing claims a pod ran.
"""

from __future__ import annotations

import pytest
from k8s_manifests import plan_and_render
from kubernetes.client import models as k8s

from airflow_gpu_provider.backends.kubernetes.pending import unschedulable
from airflow_gpu_provider.backends.kubernetes.pod_operator import build_operator
from airflow_gpu_provider.exceptions import GpuUnavailableError, HostOutOfMemoryError, RemoteTaskError
from airflow_gpu_provider.settings import ResourceSettings

GPU_SHORT = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: not helpful."


@pytest.fixture
def plan(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_GKE", '{"conn_type": "kubernetes", "extra": {"namespace": "from-connection"}}')
    plan, _ = plan_and_render(
        ResourceSettings(gpu_count=4, memory="8Gi"),
        options={"kubernetes_conn_id": "gke", "pending_timeout": 120, "startup_timeout": 900, "in_cluster": False},
    )
    return plan


def test_operator_carries_connection_timeouts_and_cleanup_policy(plan):
    operator = build_operator(plan)
    assert operator.kubernetes_conn_id == "gke"
    assert operator.in_cluster is False
    assert operator.namespace == "ml"
    assert operator.schedule_timeout_seconds == 120
    assert operator.startup_timeout_seconds == 900
    assert operator.do_xcom_push is True
    assert operator.on_finish_action.value == "delete_pod"
    assert operator.log_pod_spec_on_failure is False


def test_namespace_comes_from_the_connection_when_not_given(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_GKE",
        '{"conn_type": "kubernetes", "extra": {"namespace": "from-connection", "xcom_sidecar_container_image": '
        '"registry.example.com/alpine:3.20"}}',
    )
    _, [pod] = plan_and_render(options={"kubernetes_conn_id": "gke", "namespace": None})
    assert pod["metadata"]["namespace"] == "from-connection"
    assert pod["spec"]["containers"][1]["image"] == "registry.example.com/alpine:3.20"


def test_unschedulable_pod_becomes_gpu_unavailable_naming_the_resource(plan):
    operator = build_operator(plan)
    pod = {
        "metadata": {"name": "t-1", "namespace": "ml"},
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": GPU_SHORT}
            ],
        },
    }
    operator.unschedulable = unschedulable(pod)
    error = operator.explain_failure(plan)
    assert isinstance(error, GpuUnavailableError)
    assert "stayed Pending for 120s" in str(error)
    assert "no node has 4 nvidia.com/gpu free" in str(error)


def test_user_exception_becomes_remote_task_error_with_the_pod_traceback(plan):
    operator = build_operator(plan)
    operator.result_envelope = {
        "ok": False,
        "error": {"type": "ZeroDivisionError", "message": "division by zero", "traceback": "Traceback ...\n1/0"},
    }
    error = operator.explain_failure(plan)
    assert isinstance(error, RemoteTaskError)
    assert error.error_type == "ZeroDivisionError"
    assert "raised ZeroDivisionError in pod" in str(error)
    assert error.remote_traceback.endswith("1/0")


def test_oom_killed_container_becomes_a_memory_error(plan):
    operator = build_operator(plan)
    operator.remote_pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="t-1", namespace="ml"),
        status=k8s.V1PodStatus(
            phase="Failed",
            container_statuses=[
                k8s.V1ContainerStatus(
                    name="base",
                    image="x",
                    image_id="",
                    ready=False,
                    restart_count=0,
                    state=k8s.V1ContainerState(
                        terminated=k8s.V1ContainerStateTerminated(exit_code=137, reason="OOMKilled")
                    ),
                )
            ],
        ),
    )
    error = operator.explain_failure(plan)
    assert isinstance(error, HostOutOfMemoryError) and error.kind == "host_oom"  # an on_oom memory step
    assert "OOMKilled" in str(error)
    assert "memory limit (8Gi)" in str(error)


def test_other_failures_keep_the_providers_error(plan):
    assert build_operator(plan).explain_failure(plan) is None
