"""The ResourceClaimTemplate of a DRA pod: created before the pod, owned by it, deleted after it (run time).

KubernetesPodOperator creates one object, the pod, in ``get_or_create_pod``; :class:`~.pod_operator.GpuPodOperator`
calls :meth:`ClaimTemplate.create` there first, :meth:`ClaimTemplate.own` once the pod exists, and
:meth:`ClaimTemplate.delete` from ``cleanup`` and ``on_kill``: every path that ends the pod. The template is named
after the pod (:func:`~..pods.dra.template_name`), so a resumed (deferred) operator finds it again. Its owner
reference to the pod lets Kubernetes' garbage collector delete it with the pod even if the worker dies first. The
claim the cluster makes from it belongs to the pod too (Kubernetes deletes it with the pod).
"""

from __future__ import annotations

from typing import Any

from kubernetes.client import ApiClient, ResourceV1Api
from kubernetes.client import models as k8s
from kubernetes.client.exceptions import ApiException

from airflow_gpu_provider.backends.pods import dra

CONFLICT, NOT_FOUND = 409, 404


class ClaimTemplate:
    """The claim template of one pod: its body, and the three calls of its life.

    :param spec: the claim's spec (``KubernetesPlan.claim``)
    :param api_client: the client KubernetesPodOperator's hook made (its connection, its cluster)
    """

    def __init__(self, spec: dict[str, Any], api_client: ApiClient, log: Any) -> None:
        self.spec = spec
        self.api = ResourceV1Api(api_client)
        self.log = log

    def body(self, pod: k8s.V1Pod) -> k8s.V1ResourceClaimTemplate:
        """The template of ``pod``: its name, namespace and labels, as the client's object."""
        manifest = dra.claim_template(
            dra.template_name(pod.metadata.name), pod.metadata.namespace, dict(pod.metadata.labels or {}), self.spec
        )
        return self.api.api_client._ApiClient__deserialize(manifest, "V1ResourceClaimTemplate")  # type: ignore[attr-defined]

    def create(self, pod: k8s.V1Pod) -> None:
        """Create the template before the pod that names it (one that exists already is this pod's: kept)."""
        body = self.body(pod)
        try:
            self.api.create_namespaced_resource_claim_template(pod.metadata.namespace, body)
        except ApiException as err:
            if err.status != CONFLICT:
                raise
        self.log.info("Created ResourceClaimTemplate %s/%s", pod.metadata.namespace, body.metadata.name)

    def owner_patch(self, pod: k8s.V1Pod) -> dict[str, Any]:
        """The patch that makes ``pod`` (as the API server returned it, with its uid) the template's owner."""
        reference = {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "uid": pod.metadata.uid}
        return {"metadata": {"ownerReferences": [reference]}}

    def own(self, pod: k8s.V1Pod) -> None:
        """Let the garbage collector delete the template with ``pod`` (best effort: ``delete`` is the rule)."""
        try:
            self.api.patch_namespaced_resource_claim_template(
                dra.template_name(pod.metadata.name), pod.metadata.namespace, self.owner_patch(pod)
            )
        except ApiException as err:
            self.log.warning("Could not make pod %s the owner of its claim template: %s", pod.metadata.name, err)

    def delete(self, pod: k8s.V1Pod) -> None:
        """Delete the template of ``pod`` (gone already: nothing to do). Never raises: the task's outcome stands."""
        name = dra.template_name(pod.metadata.name)
        try:
            self.api.delete_namespaced_resource_claim_template(name, pod.metadata.namespace)
            self.log.info("Deleted ResourceClaimTemplate %s/%s", pod.metadata.namespace, name)
        except ApiException as err:
            if err.status != NOT_FOUND:
                self.log.warning("Could not delete ResourceClaimTemplate %s/%s: %s", pod.metadata.namespace, name, err)
