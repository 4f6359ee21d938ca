"""Multi-node primitive: an Indexed Job plus a headless Service, as Kubernetes API dicts.

Each of ``num_nodes`` pods runs the same pod spec. The Job controller numbers them: the completion index is the
node rank, and pod ``<job>-0`` is reachable at ``<job>-0.<job>.<namespace>.svc.<cluster domain>`` through the
headless Service of the same name (the pods' ``subdomain``). Every pod gets::

    NODE_RANK    the completion index (0 .. num_nodes-1), from the pod's job-completion-index annotation
    NUM_NODES    num_nodes
    MASTER_ADDR  pod 0's DNS name      MASTER_PORT  the rendezvous port

which is what ``accelerate launch --machine_rank $NODE_RANK --num_machines $NUM_NODES --main_process_ip
$MASTER_ADDR --main_process_port $MASTER_PORT`` and ``torchrun`` expect. Pure: no client, no cluster; the runner is
:mod:`.multinode_run`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from airflow_gpu_provider.backends.pods.options import DNS_LABEL
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.task.labels import kubernetes_label

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOB_LABEL = kubernetes_label("job")


@dataclass(frozen=True)
class MultiNodeLayout:
    """Names and addresses of one multi-node run.

    :param name: the Job's (and Service's) name: a DNS label short enough for ``<name>-<index>`` hostnames
    :param ttl_seconds_after_finished: the Job (and, through its owner reference, the Service) is garbage
        collected this long after it ends, even if the worker that started it died before cleaning up
    """

    name: str
    namespace: str
    num_nodes: int
    port: int = 29500
    cluster_domain: str = "cluster.local"
    ttl_seconds_after_finished: int = 3600

    def __post_init__(self) -> None:
        owner = "MultiNodeLayout"
        if isinstance(self.num_nodes, bool) or not isinstance(self.num_nodes, int) or self.num_nodes < 1:
            raise InvalidSettingError(owner, "num_nodes", self.num_nodes, "expected a positive integer", "e.g. 2")
        longest_host = f"{self.name}-{self.num_nodes - 1}"
        if not DNS_LABEL.fullmatch(self.name) or not DNS_LABEL.fullmatch(longest_host):
            raise InvalidSettingError(
                owner, "name", self.name, f"hostnames such as {longest_host!r} must be DNS labels", "<= 60 of [a-z0-9-]"
            )
        if not DNS_LABEL.fullmatch(self.namespace):
            raise InvalidSettingError(owner, "namespace", self.namespace, "not a DNS label", "e.g. 'default'")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 1 <= self.port <= 65535:
            raise InvalidSettingError(owner, "port", self.port, "not a TCP port", "1..65535")

    @property
    def main_address(self) -> str:
        """Pod 0's DNS name (Indexed Job + headless Service)."""
        return f"{self.name}-0.{self.name}.{self.namespace}.svc.{self.cluster_domain}"

    def environment(self) -> list[dict[str, Any]]:
        """The rank variables every pod gets (``valueFrom`` the completion-index annotation for the rank)."""
        rank_source = {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}
        return [
            {"name": "NODE_RANK", "valueFrom": rank_source},
            {"name": "NUM_NODES", "value": str(self.num_nodes)},
            {"name": "MASTER_ADDR", "value": self.main_address},
            {"name": "MASTER_PORT", "value": str(self.port)},
        ]


def _pod_template(layout: MultiNodeLayout, pod: Mapping[str, Any]) -> dict[str, Any]:
    """The Job's pod template from a single-pod manifest: rank variables, port, labels, no pod name."""
    metadata = pod.get("metadata") or {}
    spec = copy.deepcopy(dict(pod["spec"]))
    spec["restartPolicy"] = "Never"
    spec["subdomain"] = layout.name
    main = spec["containers"][0]
    main["env"] = [*(main.get("env") or []), *layout.environment()]
    ports = [p for p in main.get("ports") or [] if p.get("containerPort") != layout.port]
    main["ports"] = [*ports, {"name": "main", "containerPort": layout.port, "protocol": "TCP"}]
    return {
        "metadata": {
            "labels": {**(metadata.get("labels") or {}), JOB_LABEL: layout.name},
            "annotations": dict(metadata.get("annotations") or {}),
        },
        "spec": spec,
    }


def indexed_job(
    layout: MultiNodeLayout, pod: Mapping[str, Any], labels: Mapping[str, str], *, suspend: bool = False
) -> dict[str, Any]:
    """An Indexed Job running ``pod``'s spec on ``num_nodes`` pods, one per completion index.

    :param suspend: created suspended, for Kueue to admit (it sets ``suspend`` to false then: all pods at once)
    """
    job: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": layout.name, "namespace": layout.namespace, "labels": {**labels, JOB_LABEL: layout.name}},
        "spec": {
            "completionMode": "Indexed",
            "completions": layout.num_nodes,
            "parallelism": layout.num_nodes,
            "backoffLimit": 0,  # one failed rank fails the run: the others would wait for it forever
            "template": _pod_template(layout, pod),
            "ttlSecondsAfterFinished": layout.ttl_seconds_after_finished,
        },
    }
    if suspend:
        job["spec"]["suspend"] = True
    return job


def headless_service(
    layout: MultiNodeLayout, labels: Mapping[str, str], owner_uid: str | None = None
) -> dict[str, Any]:
    """The headless Service that gives the Job's pods their DNS names; owned by the Job once its uid is known."""
    metadata: dict[str, Any] = {
        "name": layout.name,
        "namespace": layout.namespace,
        "labels": {**labels, JOB_LABEL: layout.name},
    }
    if owner_uid is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": layout.name,
                "uid": owner_uid,
                "blockOwnerDeletion": False,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "clusterIP": "None",
            "selector": {JOB_LABEL: layout.name},
            "publishNotReadyAddresses": True,  # ranks resolve each other before any readiness
            "ports": [{"name": "main", "port": layout.port, "targetPort": layout.port, "protocol": "TCP"}],
        },
    }
