"""Kubernetes backend: one pod per task try, run by the cncf-kubernetes provider's KubernetesPodOperator.

``plan()`` is pure (:mod:`.plan`): it maps the request onto the pod's pieces. ``run()`` hands them to
KubernetesPodOperator (its hook, connection, namespace and in-cluster handling, log streaming and XCom sidecar) and
turns the outcome into a return value or a typed error; a multi-node launch runs as an Indexed Job
(:mod:`.multinode_run`). ``start()``/``resume()`` (``deferrable=True``) leave the wait to the cncf provider's own
triggers: KubernetesPodOperator's deferrable mode (:mod:`.deferral`), KubernetesJobTrigger for an Indexed Job
(:mod:`.multinode_defer`). Options: ``docs/kubernetes.md``.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, cast

from airflow_gpu_provider.backends.base import Backend, Deferral, connection_extra
from airflow_gpu_provider.backends.kubernetes import container
from airflow_gpu_provider.backends.kubernetes.deferral import DeferredPod
from airflow_gpu_provider.backends.kubernetes.kueue import ACCEPTED, kueue_name
from airflow_gpu_provider.backends.kubernetes.multinode_defer import DeferredJob
from airflow_gpu_provider.backends.kubernetes.multinode_run import IndexedJobRun, multinode_manifests
from airflow_gpu_provider.backends.kubernetes.options import KubernetesOptions
from airflow_gpu_provider.backends.kubernetes.plan import Cluster, KubernetesPlan, plan_pod
from airflow_gpu_provider.backends.kubernetes.pod_operator import build_operator, to_dict
from airflow_gpu_provider.backends.pods import dra
from airflow_gpu_provider.exceptions import GpuUnavailableError
from airflow_gpu_provider.task.request import TaskRequest
from airflow_gpu_provider.task.result import TaskResult, task_result

if TYPE_CHECKING:
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
    from airflow.sdk import Context

    from airflow_gpu_provider.config.worker import GpuConfig


class KubernetesBackend(Backend[KubernetesOptions, KubernetesPlan]):
    """Run each task try in a pod that asks for the task's GPUs, CPUs and memory."""

    name = "kubernetes"

    def __init__(self, options: KubernetesOptions, log: Any = None) -> None:
        super().__init__(options, log)
        self._running: Any = None  # the GpuPodOperator or IndexedJobRun of the current try, for kill()

    def plan(self, request: TaskRequest, conf: GpuConfig) -> KubernetesPlan:
        """Map the request onto the pod's pieces (:func:`.plan.plan_pod`). No cluster access.

        What a task does not name comes from its cluster's connection (:func:`read_cluster`): ``gpu_allocation``,
        ``kueue_queue``, the parent image.
        """
        options, cluster = self.options, read_cluster(self.options.kubernetes_conn_id)
        if options.gpu_allocation is None:
            options = dataclasses.replace(options, gpu_allocation=cluster.gpu_allocation)
        return plan_pod(request, options, conf, cluster)

    def run(self, plan: KubernetesPlan, context: Context) -> TaskResult:
        """Run the pod with KubernetesPodOperator inside the current task; the pod is deleted on every path."""
        for note in plan.notes:
            self.log.warning("%s", note)
        if plan.num_nodes > 1:
            return self._run_job(plan, context)
        try:
            return self._run_pod(plan, context)
        except GpuUnavailableError as err:
            if plan.cpu_fallback is None:
                raise
            self.log.warning("%s Running the task on CPU instead (on_missing_gpu='cpu').", err)
            return self._run_pod(plan.cpu_fallback, context)

    def _run_pod(self, plan: KubernetesPlan, context: Context) -> TaskResult:
        operator = build_operator(plan)
        self._running = operator
        try:
            envelope = operator.execute_sync(context)
        except Exception as err:  # KubernetesPodOperator has deleted the pod by now
            explained = operator.explain_failure(plan)
            if explained is None:
                raise
            raise explained from err
        finally:
            self._running = None
        return task_result(envelope, 0, where=f"pod {operator.pod_label}")

    def _run_job(self, plan: KubernetesPlan, context: Context) -> TaskResult:
        """A multi-node launch: an Indexed Job plus its headless Service, removed on every path."""
        layout, service, job = multinode_manifests(plan, context=context)
        hook = cast("KubernetesHook", build_operator(plan).hook)
        run = IndexedJobRun(
            hook,
            layout,
            service,
            job,
            log=self.log,
            pending_timeout=plan.pending_timeout,
            claim=plan.claim,
            envelope=plan.envelope,
        )
        self._running = run
        try:
            result = run.run()
        finally:
            self._running = None
        return task_result(result, 0, where=f"Job {layout.name} (rank 0)")

    def start(self, plan: KubernetesPlan, context: Context) -> TaskResult | Deferral:
        """Submit the pod (or the Indexed Job and its Service) and defer to the cncf provider's trigger."""
        for note in plan.notes:
            self.log.warning("%s", note)
        deferred = self._deferred(plan)
        self._running = deferred
        try:
            return deferred.start(context)
        finally:
            self._running = None

    def resume(
        self, plan: KubernetesPlan, state: dict[str, Any], event: Any, context: Context
    ) -> TaskResult | Deferral:
        """After the trigger's event: collect the result, clean up (or defer again while the pod still runs)."""
        deferred = self._deferred(plan)
        self._running = deferred
        try:
            return deferred.resume(state, event, context)
        finally:
            self._running = None

    def _deferred(self, plan: KubernetesPlan) -> DeferredPod | DeferredJob:
        return DeferredJob(plan, self.log) if plan.num_nodes > 1 else DeferredPod(plan, self.log)

    def render(self, request: TaskRequest, conf: GpuConfig, context: Context) -> list[dict[str, Any]]:
        """The objects :meth:`run` would submit, as API dicts (built by KubernetesPodOperator, no cluster).

        In the order they are created: the pod's (or Job's) companions first, the Secret with the envelope and the
        DRA claim template.
        """
        plan = self.plan(request, conf)
        if plan.num_nodes > 1:
            _, service, job = multinode_manifests(plan, context=context)
            objects, owner = [service, job], service["metadata"]  # the Service is named after the Job
        else:
            pod = to_dict(build_operator(plan).build_pod_request_obj(context, dry_run=True))
            objects, owner = [pod], pod["metadata"]
        name, namespace, labels = owner["name"], owner.get("namespace"), owner.get("labels") or {}
        made = [container.secret_manifest(container.secret_name(name), namespace, labels, plan.envelope)]
        if plan.claim is not None:  # the claim template they name (pods/dra.py)
            made.append(dra.claim_template(dra.template_name(name), namespace, labels, plan.claim))
        return [*made, *objects]

    def kill(self) -> None:
        """Delete the running pod (KubernetesPodOperator's ``on_kill``) or the Job and its Service, also in start()."""
        running = self._running
        if running is not None:
            running.on_kill()


def read_cluster(conn_id: str) -> Cluster:
    """The cluster's facts: its Kubernetes connection's extras ``gpu_allocation``, ``kueue_queue``, ``parent_image``.

    Each checked (an error names the connection, the extra, the value and the accepted forms). Unset, a removed
    ``[gpu]`` option still gives it for one release (warning), else the default. A connection that does not exist
    reads as one without extras (as KubernetesHook reads it). Read on the worker, never at DAG parse.
    """
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    from airflow_gpu_provider.settings.image import IMAGE_FORMS, check_image_reference

    extras, owner = KubernetesHook(conn_id=conn_id).conn_extras, f"the Kubernetes connection {conn_id!r}"

    def allocation(value: str) -> None:
        if value not in dra.ALLOCATIONS:
            raise ValueError("unknown value")

    default = Cluster()
    return Cluster(
        connection_extra(owner, extras, "gpu_allocation", "kubernetes_gpu_allocation", check=allocation,
                         accepted=" or ".join(map(repr, dra.ALLOCATIONS))) or default.gpu_allocation,
        connection_extra(owner, extras, "kueue_queue", "kueue_queue", check=kueue_name, accepted=ACCEPTED)
        or default.kueue_queue,
        connection_extra(owner, extras, "parent_image", "default_parent_image", check=check_image_reference,
                         accepted=IMAGE_FORMS) or default.parent_image,
    )  # fmt: skip
