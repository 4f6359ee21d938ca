"""What a task's pod (or Indexed Job) needs beside it: created before it, owned by it, deleted after it (run time).

Two companions, one life:

- :class:`TaskSecret`, always: the Secret that holds the task's envelope (the function's source and its arguments,
  rendered from ``{{ conn... }}`` or params, or the command line), which the main container reads as a variable
  from the Secret: the pod spec, which more people may read than Secrets, holds only a reference;
- :class:`ClaimTemplate`, with ``gpu_allocation="dra"``: the pod's ResourceClaimTemplate (:mod:`..pods.dra`).

KubernetesPodOperator creates one object, the pod, in ``get_or_create_pod``; :class:`~.pod_operator.GpuPodOperator`
calls :meth:`Companion.create` there first, :meth:`Companion.own` once the pod exists, and :meth:`Companion.delete`
from ``cleanup`` and ``on_kill``: every path that ends the pod. Each is named after its owner, so a resumed
(deferred) operator finds it again; its owner reference lets Kubernetes' garbage collector delete it with the pod
even if the worker dies first. A multi-node launch's Indexed Job (:mod:`.multinode_run`) has one of each for all
its pods, named after the Job, created before it, owned by it and deleted with it.

A claim template that exists already is taken only when it carries the provider's labels of that very try; a Secret
never is (its name is new for every pod, and it carries code: one that exists is someone else's, and is not even
read, so the worker needs no right to read Secrets). Anything else of that name fails the task before its pod is
created, and is left alone.
"""

from __future__ import annotations

from typing import Any, ClassVar

from kubernetes.client import ApiClient, CoreV1Api, ResourceV1Api
from kubernetes.client.exceptions import ApiException

from airflow_gpu_provider.backends.kubernetes import container
from airflow_gpu_provider.backends.pods import dra
from airflow_gpu_provider.exceptions import GpuTaskError
from airflow_gpu_provider.task.labels import MANAGED_BY, TRY_IDENTITY

CONFLICT, NOT_FOUND = 409, 404


class Companion:
    """One object of a pod (or of one Indexed Job's pods): its manifest, and the three calls of its life."""

    kind: ClassVar[str]
    model: ClassVar[str]  # the client's class of the object
    adopts: ClassVar[bool] = True  # whether one of its name made by this very try is taken (else: always refused)

    def __init__(self, api_client: ApiClient, log: Any) -> None:
        self.api_client, self.log = api_client, log

    def name(self, owner: str) -> str:
        """The object's name, from its owner's (a pod's or a Job's)."""
        raise NotImplementedError

    def manifest(self, name: str, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
        """The object, as the API's dict."""
        raise NotImplementedError

    def body(self, name: str, namespace: str, labels: dict[str, str]) -> Any:
        """The object as the client's model (checked by the client's models on the way)."""
        return self.api_client._ApiClient__deserialize(self.manifest(name, namespace, labels), self.model)  # type: ignore[attr-defined]

    def create(self, owner: str, namespace: str, labels: dict[str, str]) -> None:
        """Create the object before the pod or Job that names it.

        One that exists already is taken only when it is this try's own (:meth:`ours`); otherwise
        :class:`~airflow_gpu_provider.exceptions.GpuTaskError`, and nothing of the task is submitted.
        """
        name = self.name(owner)
        wanted = self.manifest(name, namespace, labels)
        try:
            self._call("create", namespace, self.body(name, namespace, labels))
        except ApiException as err:
            if err.status != CONFLICT:
                raise
            found = (
                self.api_client.sanitize_for_serialization(self._call("read", name, namespace)) if self.adopts else {}
            )
            if not self.ours(found, wanted):
                theirs = (found.get("metadata") or {}).get("labels")
                raise GpuTaskError(
                    f"A {self.kind} {namespace}/{name} exists already and is not this task try's own"
                    + (f" (its labels {theirs or {}} are not the provider's for {_identity(labels)})" if found else "")
                    + ": it is not used, and nothing was submitted. Delete it, or find out who made it."
                ) from None
            self.log.info("Taking %s %s/%s, made for this very try", self.kind, namespace, name)
            return
        self.log.info("Created %s %s/%s", self.kind, namespace, name)

    def ours(self, found: dict[str, Any], wanted: dict[str, Any]) -> bool:
        """Whether an existing object is the one this try made: the provider's labels, and this try's identity."""
        if not found:
            return False
        theirs, mine = (obj.get("metadata", {}).get("labels") or {} for obj in (found, wanted))
        identity = [key for key in TRY_IDENTITY if key in mine]
        managed = all(theirs.get(key) == value for key, value in MANAGED_BY.items())
        return bool(identity) and managed and all(theirs.get(key) == mine[key] for key in identity)

    @staticmethod
    def owner_patch(owner: Any, kind: str = "Pod", api_version: str = "v1") -> dict[str, Any]:
        """The patch that makes ``owner`` (a pod or Job as the API server returned it, with its uid) the owner."""
        reference = {"apiVersion": api_version, "kind": kind, "name": owner.metadata.name, "uid": owner.metadata.uid}
        return {"metadata": {"ownerReferences": [reference]}}

    def own(self, owner_name: str, namespace: str, owner: Any, kind: str = "Pod", api_version: str = "v1") -> None:
        """Let the garbage collector delete the object with ``owner`` (best effort: ``delete`` is the rule)."""
        name = self.name(owner_name)
        try:
            self._call("patch", name, namespace, self.owner_patch(owner, kind, api_version))
        except ApiException as err:
            self.log.warning("Could not give the %s %s/%s an owner: %s", self.kind, namespace, name, err)

    def delete(self, owner_name: str, namespace: str) -> None:
        """Delete the object (gone already: nothing to do). Never raises: the task's outcome stands."""
        name = self.name(owner_name)
        try:
            self._call("delete", name, namespace)
            self.log.info("Deleted %s %s/%s", self.kind, namespace, name)
        except ApiException as err:
            if err.status != NOT_FOUND:
                self.log.warning("Could not delete %s %s/%s: %s", self.kind, namespace, name, err)

    def _call(self, verb: str, *args: Any) -> Any:
        raise NotImplementedError


class TaskSecret(Companion):
    """The Secret with the task's envelope (``container.SECRET_KEY``), which the main container reads.

    :param envelope: the envelope as the runtime reads it (base64 JSON; ``KubernetesPlan.envelope``)
    """

    kind, model, adopts = "Secret", "V1Secret", False

    def __init__(self, envelope: str, api_client: ApiClient, log: Any) -> None:
        super().__init__(api_client, log)
        self.envelope = envelope
        self.api = CoreV1Api(api_client)

    def name(self, owner: str) -> str:  # noqa: D102
        return container.secret_name(owner)

    def manifest(self, name: str, namespace: str, labels: dict[str, str]) -> dict[str, Any]:  # noqa: D102
        return container.secret_manifest(name, namespace, labels, self.envelope)

    def _call(self, verb: str, *args: Any) -> Any:
        return getattr(self.api, f"{verb}_namespaced_secret")(*args)


class ClaimTemplate(Companion):
    """The ResourceClaimTemplate of a DRA pod (or of one Indexed Job's pods).

    :param spec: the claim's spec (``KubernetesPlan.claim``)
    """

    kind, model = "ResourceClaimTemplate", "V1ResourceClaimTemplate"

    def __init__(self, spec: dict[str, Any], api_client: ApiClient, log: Any) -> None:
        super().__init__(api_client, log)
        self.spec = spec
        self.api = ResourceV1Api(api_client)

    def name(self, owner: str) -> str:  # noqa: D102
        return dra.template_name(owner)

    def manifest(self, name: str, namespace: str, labels: dict[str, str]) -> dict[str, Any]:  # noqa: D102
        return dra.claim_template(name, namespace, labels, self.spec)

    def _call(self, verb: str, *args: Any) -> Any:
        return getattr(self.api, f"{verb}_namespaced_resource_claim_template")(*args)


def companions(api_client: ApiClient, log: Any, *, envelope: str, claim: dict[str, Any] | None) -> list[Companion]:
    """The companions of a plan's pod or Job, in the order they are created: the Secret, then the claim template."""
    found: list[Companion] = [TaskSecret(envelope, api_client, log)]
    return [*found, ClaimTemplate(claim, api_client, log)] if claim is not None else found


class WithCompanions:
    """KubernetesPodOperator's pod life, with the pod's companions: created first, owned by the pod, deleted after it.

    A mixin of :class:`~.pod_operator.GpuPodOperator` (``envelope``, ``claim``; KubernetesPodOperator's ``client``,
    ``pod``, ``pod_manager`` and ``log``).
    """

    envelope: str
    claim: dict[str, Any] | None
    client: Any
    pod: Any
    pod_manager: Any
    log: Any

    def companions(self) -> list[Companion]:
        """The pod's Secret and DRA claim template, through the hook's client."""
        return companions(self.client.api_client, self.log, envelope=self.envelope, claim=self.claim)

    def get_or_create_pod(self, pod_request_obj: Any, context: Any) -> Any:
        """KubernetesPodOperator's, with the companions created first and owned by the pod that runs."""
        name, namespace = pod_request_obj.metadata.name, pod_request_obj.metadata.namespace
        made: list[Companion] = []
        try:
            for companion in self.companions():
                companion.create(name, namespace, dict(pod_request_obj.metadata.labels or {}))
                made.append(companion)  # only what this try made (or took as its own) is ever deleted
            pod = super().get_or_create_pod(pod_request_obj, context)  # type: ignore[misc]
        except BaseException:
            delete_all(made, name, namespace)
            raise
        if pod.metadata.name != name:  # an earlier try's pod, with its own companions
            delete_all(made, name, namespace)
            return pod
        try:
            remote = self.pod_manager.read_pod(pod)
        except ApiException:
            return pod
        for companion in made:
            companion.own(name, namespace, remote)
        return pod

    def cleanup(self, pod: Any, remote_pod: Any, *args: Any, **kwargs: Any) -> None:
        """KubernetesPodOperator's cleanup, then the pod's companions deleted (also when the cleanup fails).

        Only those of a pod that was created or taken over (``self.pod``): when the pod's creation failed, what was
        made for it is deleted there, and what exists under its companions' names is someone else's.
        """
        try:
            super().cleanup(pod, remote_pod, *args, **kwargs)  # type: ignore[misc]
        finally:
            if pod is not None and self.pod is not None and pod.metadata.name == self.pod.metadata.name:
                delete_all(self.companions(), pod.metadata.name, pod.metadata.namespace)

    def on_kill(self) -> None:
        """Delete the pod (KubernetesPodOperator's ``on_kill``), then its companions."""
        try:
            super().on_kill()  # type: ignore[misc]
        finally:
            if self.pod is not None:
                delete_all(self.companions(), self.pod.metadata.name, self.pod.metadata.namespace)


def delete_all(made: list[Companion], owner: str, namespace: str) -> None:
    """Delete the companions of ``owner`` (never raises)."""
    for companion in made:
        companion.delete(owner, namespace)


def _identity(labels: dict[str, str]) -> str:
    return ", ".join(f"{key}={labels[key]}" for key in TRY_IDENTITY if key in labels) or "this try"
