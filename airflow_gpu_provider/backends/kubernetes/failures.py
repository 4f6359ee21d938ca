"""Whether a pod failed because of the cluster, not the task: evicted, preempted, lost with its node, no image.

A pure function over the pod as the API server returns it (camelCase dict), so every rule is tested on the API's
own answers without a cluster. The record it returns is the runtime's ``failure`` (``runtime/failures.py``) with the
pod's node: the class is the same one the runtime gives an Xid error or an NCCL timeout, and the worker treats both
alike (``escalation/infrastructure.py``: the log, XCom ``gpu_failure``, the next try's node anti-affinity).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_gpu_provider.exceptions import GpuInfrastructureError
from airflow_gpu_provider.runtime.protocol import INFRASTRUCTURE

# DisruptionTarget's reasons (k8s.io/api/core/v1: PodReasonPreemptionByScheduler, ...), in words.
DISRUPTIONS = {
    "PreemptionByScheduler": "preempted by the scheduler for a pod of higher priority",
    "DeletionByTaintManager": "lost with its node (the node became unreachable or not ready)",
    "EvictionByEvictionAPI": "evicted (a drain or a disruption of the node)",
    "DeletionByPodGC": "lost with its node (the node no longer exists)",
    "TerminationByKubelet": "stopped by the kubelet (node pressure or a node shutdown)",
}
PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff")  # the kubelet's waiting reasons


def _record(reason: str, evidence: list[str], node: str | None) -> dict[str, Any]:
    return {"class": INFRASTRUCTURE, "reason": reason, "evidence": evidence, "host": node, "node": node, "gpus": []}


def pod_failure(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``gpu_failure`` record of a pod that the cluster made fail, or ``None`` for any other end."""
    status = pod.get("status") or {}
    node = (pod.get("spec") or {}).get("nodeName")
    name = f"{(pod.get('metadata') or {}).get('namespace', '?')}/{(pod.get('metadata') or {}).get('name', '?')}"
    if status.get("reason") in ("Evicted", "NodeLost", "Preempting"):
        what = {"Evicted": "evicted", "NodeLost": "lost with its node", "Preempting": "preempted"}[status["reason"]]
        return _record(what, [f"pod {name}: {status['reason']}: {status.get('message') or ''}".rstrip(": ")], node)
    for condition in status.get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            reason = str(condition.get("reason") or "")
            what = DISRUPTIONS.get(reason, f"disrupted ({reason})")
            message = condition.get("message") or ""
            return _record(what, [f"pod {name}: DisruptionTarget {reason}: {message}".rstrip(": ")], node)
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in PULL_FAILURES:
            image = container.get("image", "?")
            message = f"pod {name}: {waiting['reason']} for image {image}: {waiting.get('message') or ''}"
            return _record("the image cannot be pulled", [message.rstrip(": ")], node)
    return None


def cluster_error(where: str, *pods: Mapping[str, Any] | None) -> GpuInfrastructureError | None:
    """The error of the first of ``pods`` (as read, ``None`` where unread) that the cluster made fail, else ``None``."""
    for pod in pods:
        failure = None if pod is None else pod_failure(pod)
        if failure is not None:
            text = f"The {where} failed because of the cluster, not the task: {failure['reason']}"
            return GpuInfrastructureError(f"{text}. {'; '.join(failure['evidence'])}", failure=failure)
    return None


def unschedulable_failure(explanation: str) -> dict[str, Any]:
    """The record of a pod that found no node before its ``pending_timeout`` (no node to avoid)."""
    return _record("no node could take the pod in time", [explanation], None)
