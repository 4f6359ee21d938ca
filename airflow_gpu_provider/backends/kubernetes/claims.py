"""The ResourceClaimTemplate of a DRA pod: created before the pod, owned by it, deleted after it (run time).

KubernetesPodOperator creates one object, the pod, in ``get_or_create_pod``; :class:`~.pod_operator.GpuPodOperator`
calls :meth:`ClaimTemplate.create` there first, :meth:`ClaimTemplate.own` once the pod exists, and
:meth:`ClaimTemplate.delete` from ``cleanup`` and ``on_kill``: every path that ends the pod. The template is named
after the pod (:func:`~..pods.dra.template_name`), so a resumed (deferred) operator finds it again. Its owner
reference to the pod lets Kubernetes' garbage collector delete it with the pod even if the worker dies first. The
claim the cluster makes from it belongs to the pod too (Kubernetes deletes it with the pod). A multi-node launch's
Indexed Job (:mod:`.multinode_run`) has one template for all its pods (each gets its own claim), named after the Job,
created before it, owned by it and deleted with it.
"""

from __future__ import annotations

from typing import Any

from kubernetes.client import ApiClient, ResourceV1Api
from kubernetes.client import models as k8s
from kubernetes.client.exceptions import ApiException

from airflow_gpu_provider.backends.pods import dra

CONFLICT, NOT_FOUND = 409, 404


class ClaimTemplate:
    """The claim template of one pod (or one Indexed Job's pods): its body, and the three calls of its life.

    :param spec: the claim's spec (``KubernetesPlan.claim``)
    :param api_client: the client of the cncf provider's hook (its connection, its cluster)
    """

    def __init__(self, spec: dict[str, Any], api_client: ApiClient, log: Any) -> None:
        self.spec = spec
        self.api = ResourceV1Api(api_client)
        self.log = log

    def body(self, name: str, namespace: str, labels: dict[str, str]) -> k8s.V1ResourceClaimTemplate:
        """The template, as the client's object."""
        manifest = dra.claim_template(name, namespace, labels, self.spec)
        return self.api.api_client._ApiClient__deserialize(manifest, "V1ResourceClaimTemplate")  # type: ignore[attr-defined]

    def create(self, name: str, namespace: str, labels: dict[str, str]) -> None:
        """Create the template before the pod or Job that names it (one that exists already is kept: a retry's)."""
        try:
            self.api.create_namespaced_resource_claim_template(namespace, self.body(name, namespace, labels))
        except ApiException as err:
            if err.status != CONFLICT:
                raise
        self.log.info("Created ResourceClaimTemplate %s/%s", namespace, name)

    @staticmethod
    def owner_patch(owner: Any, kind: str = "Pod", api_version: str = "v1") -> dict[str, Any]:
        """The patch that makes ``owner`` (a pod or Job as the API server returned it, with its uid) the owner."""
        reference = {"apiVersion": api_version, "kind": kind, "name": owner.metadata.name, "uid": owner.metadata.uid}
        return {"metadata": {"ownerReferences": [reference]}}

    def own(self, name: str, namespace: str, owner: Any, kind: str = "Pod", api_version: str = "v1") -> None:
        """Let the garbage collector delete the template with ``owner`` (best effort: ``delete`` is the rule)."""
        try:
            patch = self.owner_patch(owner, kind, api_version)
            self.api.patch_namespaced_resource_claim_template(name, namespace, patch)
        except ApiException as err:
            self.log.warning("Could not give the claim template %s/%s an owner: %s", namespace, name, err)

    def delete(self, name: str, namespace: str) -> None:
        """Delete the template (gone already: nothing to do). Never raises: the task's outcome stands."""
        try:
            self.api.delete_namespaced_resource_claim_template(name, namespace)
            self.log.info("Deleted ResourceClaimTemplate %s/%s", namespace, name)
        except ApiException as err:
            if err.status != NOT_FOUND:
                self.log.warning("Could not delete ResourceClaimTemplate %s/%s: %s", namespace, name, err)


def of_pod(pod: k8s.V1Pod) -> tuple[str, str]:
    """``(name, namespace)`` of a pod's claim template."""
    return dra.template_name(pod.metadata.name), pod.metadata.namespace
