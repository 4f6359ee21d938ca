"""Run the multi-node primitive: create the Indexed Job and its headless Service, follow rank 0, clean up.

Uses the cncf-kubernetes provider's ``KubernetesHook`` (connection, namespace, in-cluster handling) and
``PodManager`` (log streaming). Cleanup deletes the Job, its pods and the Service on success, on failure and from
``kill()``; the Job's ``ttlSecondsAfterFinished`` and the Service's owner reference are the safety net when the
worker itself dies. ``run()`` needs a cluster: it has no test that runs it (see docs/testing.md); the deferred
run (:mod:`.multinode_defer`) uses ``create``, ``rank0_result`` and ``cleanup`` with the wait in the triggerer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
from airflow.providers.cncf.kubernetes.utils.pod_manager import PodManager
from kubernetes.client.exceptions import ApiException

from airflow_gpu_provider.backends.kubernetes.companions import companions, delete_all
from airflow_gpu_provider.backends.kubernetes.container import ENVELOPE_ENV, envelope_variable
from airflow_gpu_provider.backends.kubernetes.failures import cluster_error
from airflow_gpu_provider.backends.kubernetes.kueue import (
    queue_the_job_only,
    waited_too_long,
    waiting_line,
    waiting_queue,
)
from airflow_gpu_provider.backends.kubernetes.multinode import COMPLETION_INDEX, JOB_LABEL, MultiNodeLayout
from airflow_gpu_provider.backends.kubernetes.multinode import headless_service as service_manifest
from airflow_gpu_provider.backends.kubernetes.multinode import indexed_job as job_manifest
from airflow_gpu_provider.backends.kubernetes.pending import termination_error, unschedulable
from airflow_gpu_provider.backends.kubernetes.plan import KubernetesPlan
from airflow_gpu_provider.backends.kubernetes.pod_operator import build_operator, to_dict
from airflow_gpu_provider.backends.pods import dra
from airflow_gpu_provider.exceptions import GpuTaskError, GpuUnavailableError
from airflow_gpu_provider.policy.pods import final
from airflow_gpu_provider.task.result import result_in_log

MAIN_CONTAINER = "base"


def multinode_manifests(
    plan: KubernetesPlan, *, context: Any = None, namespace: str | None = None
) -> tuple[MultiNodeLayout, dict[str, Any], dict[str, Any]]:
    """``(layout, service, job)`` for ``plan.num_nodes`` copies of the plan's pod (built by KubernetesPodOperator).

    The pod has no XCom sidecar: in a Job it would keep every pod running after the task ends. The pod is checked
    as it is built (``GpuPodOperator``), and the Job again, as submitted (``policy.pods.final``). Its pods read the
    envelope from the Job's Secret and get their GPUs from the Job's claim template (:mod:`.companions`).
    """
    operator = build_operator(plan)
    operator.do_xcom_push = False
    pod = to_dict(operator.build_pod_request_obj(context, dry_run=True))
    name = pod["metadata"]["name"][: 60 - len(str(plan.num_nodes - 1))].rstrip("-.")
    layout = MultiNodeLayout(name, namespace or pod["metadata"]["namespace"], plan.num_nodes, plan.port)
    labels = dict(pod["metadata"].get("labels") or {})
    main = pod["spec"]["containers"][0]
    main["env"] = [*(v for v in main.get("env") or [] if v["name"] != ENVELOPE_ENV), envelope_variable(layout.name)]
    if plan.claim is not None:  # one claim template for the Job's pods, named after the Job (each gets its claim)
        pod["spec"]["resourceClaims"] = dra.pod_claims(dra.template_name(layout.name))
    job = queue_the_job_only(job_manifest(layout, pod, labels, suspend=bool(plan.kueue_queue)))  # Kueue admits it
    what = f"Indexed Job {layout.name} of task {plan.task_id}"
    job = final(job, operator.pod_security, what, operator.allowed_here())
    return layout, service_manifest(layout, labels), job


class IndexedJobRun:
    """One run of an Indexed Job with its headless Service; ``run()`` cleans up on every path, ``kill()`` too."""

    def __init__(
        self,
        hook: KubernetesHook,
        layout: MultiNodeLayout,
        service: Mapping[str, Any],
        job: Mapping[str, Any],
        *,
        log: logging.Logger | None = None,
        poll_interval: float = 5.0,
        pending_timeout: float = 300.0,
        claim: dict[str, Any] | None = None,
        envelope: str = "",
    ) -> None:
        """One run; nothing is submitted before :meth:`create`.

        :param claim: the spec of the pods' DRA claim (``KubernetesPlan.claim``): its template goes with the Job
        :param envelope: the task's envelope (``KubernetesPlan.envelope``): its Secret goes with the Job
        """
        self.hook, self.layout, self.service, self.job = hook, layout, dict(service), dict(job)
        self.log = log or logging.getLogger(__name__)
        self.companions = companions(hook.api_client, self.log, envelope=envelope, claim=claim)
        self._made: list[Any] = []  # the companions this run made (or an attached run's earlier try made): deleted
        self.poll_interval, self.pending_timeout = poll_interval, pending_timeout
        self._created = False

    @classmethod
    def attach(
        cls,
        hook: KubernetesHook,
        layout: MultiNodeLayout,
        *,
        log: logging.Logger | None = None,
        claim: dict[str, Any] | None = None,
    ) -> IndexedJobRun:
        """The run of a Job submitted earlier (by another worker's ``create``): to collect and clean up."""
        run = cls(hook, layout, {}, {}, log=log, claim=claim)
        run._created, run._made = True, list(run.companions)
        return run

    @property
    def selector(self) -> str:
        """Label selector of this run's pods."""
        return f"{JOB_LABEL}={self.layout.name}"

    def run(self) -> dict[str, Any] | None:
        """Create, follow rank 0's log until the Job ends; return rank 0's result envelope; always clean up.

        A failed Job whose rank 0 reported the exception returns that error envelope (with its traceback); any
        other failure raises.
        """
        try:
            self.create()
            try:
                self._follow()
            except GpuTaskError:
                result = self.rank0_result()
                if result is not None and not result.get("ok"):
                    return result
                raise
            return self.rank0_result()
        finally:
            self.cleanup()

    def rank0(self) -> Any:
        """Rank 0's pod (completion index 0), if it exists."""
        return next((p for p in self._pods() if (p.metadata.annotations or {}).get(COMPLETION_INDEX) == "0"), None)

    def rank0_result(self, *, print_log: bool = False) -> dict[str, Any] | None:
        """The result envelope rank 0 printed as its last ``[gpu] result:`` log line, if any.

        :param print_log: first copy rank 0's whole log into the task's log (after a deferral: nobody followed it)
        """
        rank0 = self.rank0()
        if rank0 is None:
            return None
        if print_log:
            PodManager(kube_client=self.hook.core_v1_client).fetch_container_logs(rank0, MAIN_CONTAINER, follow=False)
        text = self.hook.core_v1_client.read_namespaced_pod_log(
            rank0.metadata.name, self.layout.namespace, container=MAIN_CONTAINER, tail_lines=200
        )
        return result_from_log(text)

    def killed_rank(self, limits: Mapping[str, str]) -> GpuTaskError | None:
        """The error of a rank the cluster stopped (``failures.py``), or whose container was killed (``OOMKilled``)."""
        for pod in self._pods():
            cluster = cluster_error(f"rank of Job {self.layout.name} (pod {pod.metadata.name})", to_dict(pod))
            if cluster is not None:
                return cluster
            error = termination_error(to_dict(pod), MAIN_CONTAINER, limits)
            if error is not None:
                return error
        return None

    def create(self) -> None:
        """Submit the Job, then its Service (owned by the Job, so that it goes with it)."""
        namespace = self.layout.namespace
        self._created = True  # from here on, cleanup has something to delete
        labels = self.service["metadata"].get("labels", {})
        for companion in self.companions:  # the Secret (and claim template) the Job's pods name
            companion.create(self.layout.name, namespace, labels)
            self._made.append(companion)
        created = self.hook.batch_v1_client.create_namespaced_job(namespace, self.job)
        for companion in self._made:
            companion.own(self.layout.name, namespace, created, kind="Job", api_version="batch/v1")
        owned = service_manifest(self.layout, self.service["metadata"].get("labels", {}), created.metadata.uid)
        self.hook.core_v1_client.create_namespaced_service(namespace, owned)
        self.log.info(
            "Started Indexed Job %s/%s: %d nodes, main address %s",
            namespace,
            self.layout.name,
            self.layout.num_nodes,
            self.layout.main_address,
        )

    def _pods(self) -> list[Any]:
        return self.hook.core_v1_client.list_namespaced_pod(self.layout.namespace, label_selector=self.selector).items

    def _follow(self) -> None:
        started = time.monotonic()
        followed = False
        manager = PodManager(kube_client=self.hook.core_v1_client)
        waiting: str | None = None  # the Kueue queue the Job was last seen waiting in
        while True:
            job = self.hook.batch_v1_client.read_namespaced_job_status(self.layout.name, self.layout.namespace)
            queue = self._admission(to_dict(job), waiting, time.monotonic() - started)
            if queue != waiting:  # a new wait: for a node once admitted, for admission again once preempted
                started, waiting = time.monotonic(), queue
            conditions = {c.type: c for c in (job.status.conditions or []) if c.status == "True"}
            if "Failed" in conditions:
                failed = conditions["Failed"]
                raise GpuTaskError(f"Job {self.layout.name} failed: {failed.reason}: {failed.message or ''}".strip())
            if "Complete" in conditions:
                self.log.info("Job %s completed on all %d nodes", self.layout.name, self.layout.num_nodes)
                return
            pods = self._pods()
            self._check_pending(pods, time.monotonic() - started)
            rank0 = next((p for p in pods if (p.metadata.annotations or {}).get(COMPLETION_INDEX) == "0"), None)
            if not followed and rank0 is not None and rank0.status.phase in ("Running", "Succeeded", "Failed"):
                manager.fetch_container_logs(rank0, MAIN_CONTAINER, follow=True)
                followed = True
            time.sleep(self.poll_interval)

    def _admission(self, job: Mapping[str, Any], before: str | None, waited: float) -> str | None:
        """The queue a suspended Job waits in for Kueue (said once in the log, and again after a preemption).

        A wait longer than ``pending_timeout`` fails the run (the Job is deleted); the clock starts again once the
        Job is admitted (for its pods to get nodes), and when Kueue preempts it (suspends it again).
        """
        queue = waiting_queue({"kind": "Job", **job})
        what = f"Job {self.layout.namespace}/{self.layout.name}"
        if queue is not None and before is None:
            self.log.info("%s", waiting_line(what, queue))
        elif queue is None and before is not None:
            self.log.info("%s was admitted by Kueue (queue %r)", what, before)
        if queue is not None and waited >= self.pending_timeout:
            raise GpuUnavailableError(waited_too_long(what, queue, self.pending_timeout))
        return queue

    def _check_pending(self, pods: list[Any], waited: float) -> None:
        if waited < self.pending_timeout:
            return
        for pod in pods:
            verdict = unschedulable(to_dict(pod))
            if verdict is not None:
                limits = to_dict(pod.spec.containers[0].resources).get("limits", {})
                raise GpuUnavailableError(verdict.explain(waited, limits))

    def cleanup(self) -> None:
        """Delete the Job, its pods and the Service (missing objects are fine); log what could not be deleted."""
        if not self._created:
            return
        namespace, name = self.layout.namespace, self.layout.name
        steps = (
            ("job", lambda: self.hook.batch_v1_client.delete_namespaced_job(
                name, namespace, propagation_policy="Background")),
            ("pods", lambda: self.hook.core_v1_client.delete_collection_namespaced_pod(
                namespace, label_selector=self.selector)),
            ("service", lambda: self.hook.core_v1_client.delete_namespaced_service(name, namespace)),
        )  # fmt: skip
        delete_all(self._made, name, namespace)  # each logs what it could not delete itself
        self._made = []
        for what, delete in steps:
            try:
                delete()
            except ApiException as err:
                if err.status != 404:
                    self.log.error("Could not delete the %s of %s/%s: %s", what, namespace, name, err)
        self._created = False

    def kill(self) -> None:
        """Called from ``on_kill``: delete everything now."""
        self.cleanup()

    on_kill = kill


def result_from_log(text: str) -> dict[str, Any] | None:
    """The last result envelope the runtime printed in a log (its result argument ``-``)."""
    return result_in_log(text, "rank 0")
