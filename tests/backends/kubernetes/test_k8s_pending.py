"""Pending pods: the scheduler's messages (as the API server reports them) -> a message naming what is missing."""

from __future__ import annotations

from airflow_gpu_provider.backends.kubernetes.pending import termination_error, unschedulable
from airflow_gpu_provider.exceptions import GpuTaskError, HostOutOfMemoryError

GPU_SHORT = (
    "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: "
    "3 No preemption victims found for incoming pod."
)
MIXED = (
    "0/5 nodes are available: 1 node(s) had untolerated taint {node-role.kubernetes.io/control-plane: }, "
    "2 Insufficient cpu, 2 node(s) didn't match Pod's node affinity/selector. preemption: 0/5 nodes are available: "
    "2 No preemption victims found for incoming pod, 3 Preemption is not helpful for scheduling."
)


def pending_pod(message: str | None, *, status: str = "False") -> dict:
    conditions = (
        []
        if message is None
        else [{"type": "PodScheduled", "status": status, "reason": "Unschedulable", "message": message}]
    )
    return {
        "metadata": {"name": "train-x1", "namespace": "ml"},
        "status": {"phase": "Pending", "conditions": conditions, "qosClass": "Guaranteed"},
    }


def test_insufficient_gpu_names_the_resource_and_the_amount():
    verdict = unschedulable(pending_pod(GPU_SHORT))
    assert verdict is not None
    assert list(verdict.insufficient) == ["nvidia.com/gpu"]
    text = verdict.explain(300, {"nvidia.com/gpu": "2", "cpu": "8"})
    assert "ml/train-x1 stayed Pending for 300s" in text
    assert "no node has 2 nvidia.com/gpu free (3 node(s) have too little nvidia.com/gpu)" in text
    assert "on_missing_gpu='wait'" in text
    assert GPU_SHORT in text


def test_mixed_reasons_are_all_named():
    verdict = unschedulable(pending_pod(MIXED))
    assert verdict.insufficient == {"cpu": 2}
    assert verdict.taints == ["{node-role.kubernetes.io/control-plane: }"]
    assert verdict.selector_mismatch == 2
    text = verdict.explain(60, {"cpu": "64"})
    assert "no node has 64 cpu free" in text
    assert "untolerated taint" in text
    assert "label_scheme" in text


def test_older_taint_wording_and_mig_resources():
    message = (
        "0/2 nodes are available: 1 node(s) had taint {nvidia.com/gpu: present}, that the pod didn't tolerate, "
        "1 Insufficient nvidia.com/mig-1g.10gb."
    )
    verdict = unschedulable(pending_pod(message))
    assert verdict.insufficient == {"nvidia.com/mig-1g.10gb": 1}
    assert verdict.taints == ["{nvidia.com/gpu: present}"]


def test_event_message_is_used_when_the_condition_has_none():
    verdict = unschedulable(pending_pod(None), events=["Successfully assigned", GPU_SHORT])
    assert verdict is not None and list(verdict.insufficient) == ["nvidia.com/gpu"]


def test_scheduled_or_unknown_pods_are_not_unschedulable():
    assert unschedulable(pending_pod(None)) is None  # not looked at by the scheduler yet
    assert unschedulable(pending_pod("", status="True")) is None  # scheduled: pulling the image
    running = pending_pod(GPU_SHORT)
    running["status"]["phase"] = "Running"
    assert unschedulable(running) is None


def test_oom_killed_container_is_explained_with_its_limit():
    pod = {
        "metadata": {"name": "train-x1", "namespace": "ml"},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {"name": "base", "state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}},
                {"name": "airflow-xcom-sidecar", "state": {"running": {}}},
            ],
        },
    }
    error = termination_error(pod, "base", {"memory": "4Gi"})
    assert isinstance(error, HostOutOfMemoryError)  # an on_oom ladder's memory step
    assert "OOMKilled (exit code 137)" in str(error)
    assert "memory limit (4Gi)" in str(error)


def test_another_kill_is_named_but_is_no_oom():
    pod = {
        "status": {
            "containerStatuses": [
                {"name": "base", "state": {"terminated": {"reason": "ContainerCannotRun", "exitCode": 128}}}
            ]
        }
    }
    error = termination_error(pod, "base", {})
    assert type(error) is GpuTaskError and "ContainerCannotRun (exit code 128)" in str(error)


def test_ordinary_errors_are_left_to_the_traceback():
    pod = {"status": {"containerStatuses": [{"name": "base", "state": {"terminated": {"reason": "Error"}}}]}}
    assert termination_error(pod, "base", {}) is None
    assert termination_error({"status": {}}, "base", {}) is None
