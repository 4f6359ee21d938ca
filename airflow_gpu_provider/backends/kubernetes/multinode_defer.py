"""A deferred multi-node run: the Indexed Job waited for by the cncf provider's ``KubernetesJobTrigger``.

The Job and its Service are submitted as ``IndexedJobRun`` submits them; the wait goes to the trigger that
``KubernetesJobOperator(deferrable=True)`` defers to. ``start`` submits the Job and the Service and defers;
``resume`` copies rank 0's log into the task's log, reads rank 0's result envelope (its last log line: a Job's
pods have no XCom sidecar), turns a failure into the provider's typed error (the user's exception, an
``OOMKilled`` rank, the Job's own condition), and deletes the Job, its pods and the Service on every path.

With ``TaskRequest.durable`` the Job's name is kept in the task state store (Airflow 3.3+): a later try whose
worker died before the task deferred finds the Job still running and defers to it instead of submitting a second.
The store is data the task's own code can write: a Job is taken over (or, once over, deleted) only in the namespace
this try would use and when its labels name this task instance, as the provider labels its Jobs.

What ``KubernetesJobTrigger`` cannot do, and what is done instead:

- it waits for the Job's ``Complete`` or ``Failed`` condition only: it neither sees a pod that no node can take
  (no ``pending_timeout`` while deferred) nor a deadline. The task's ``execution_timeout`` therefore becomes the
  Job's ``activeDeadlineSeconds``: Kubernetes fails the Job then, the trigger fires and ``resume`` cleans up;
  without ``execution_timeout`` a Job whose pods never start waits until someone stops the task;
- it streams no log while deferred: rank 0's log is printed when the task resumes;
- it has no ``on_kill``: a deferred task marked failed or success leaves the Job running until it ends; its
  ``ttlSecondsAfterFinished`` then deletes it, and the Service with it (owner reference);
- it reads the kubeconfig file (``config_file``) on the triggerer, where the same path must exist
  (KubernetesPodTrigger carries the file's content instead).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from airflow.providers.cncf.kubernetes.triggers.job import KubernetesJobTrigger
from kubernetes.client.exceptions import ApiException

from airflow_gpu_provider.backends.base import Deferral
from airflow_gpu_provider.backends.kubernetes.deferral import execution_timeout
from airflow_gpu_provider.backends.kubernetes.kueue import waiting_line, waiting_queue
from airflow_gpu_provider.backends.kubernetes.multinode import MultiNodeLayout
from airflow_gpu_provider.backends.kubernetes.multinode_run import MAIN_CONTAINER, IndexedJobRun, multinode_manifests
from airflow_gpu_provider.backends.kubernetes.pod_operator import build_operator
from airflow_gpu_provider.exceptions import GpuTaskError
from airflow_gpu_provider.task.result import TaskResult, task_result

if TYPE_CHECKING:
    import logging

    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
    from airflow.sdk import Context

    from airflow_gpu_provider.backends.kubernetes.plan import KubernetesPlan

#: The labels of a Job that name its task instance (KubernetesPodOperator's, and the provider's own)
IDENTITY_LABELS = ("dag_id", "task_id", "run_id", "map_index", "app.kubernetes.io/managed-by")
#: The task state store's key for the Job a try submitted (KubernetesPodOperator keeps its pod under its own key).
JOB_STATE_KEY = "gpu_indexed_job"
POLL_INTERVAL = 5.0
#: Beyond the Job's deadline, so that Airflow's own deferral timeout never fires before the Job's Failed condition
DEADLINE_MARGIN = datetime.timedelta(seconds=120)


class DeferredJob:
    """Starts and resumes the deferred Indexed Job of a multi-node plan; ``on_kill`` deletes what it submitted."""

    def __init__(self, plan: KubernetesPlan, log: logging.Logger) -> None:
        self.plan = plan
        self.log = log
        self.run: IndexedJobRun | None = None

    def _hook(self) -> KubernetesHook:
        return cast("KubernetesHook", build_operator(self.plan).hook)

    def start(self, context: Context) -> Deferral:
        """Submit the Job and its Service (or find the one an earlier try left running), then defer."""
        store = context.get("task_state_store") if self.plan.durable else None
        hook = self._hook()
        layout, service, job = multinode_manifests(self.plan, context=context)
        earlier = (
            self._running_job(hook, store.get(JOB_STATE_KEY), layout.namespace, job) if store is not None else None
        )
        deadline = _deadline(context)
        if earlier is not None:
            layout = earlier
        else:
            if deadline is not None:
                job["spec"]["activeDeadlineSeconds"] = int(deadline.total_seconds())
            self.run = IndexedJobRun(
                hook, layout, service, job, log=self.log, claim=self.plan.claim, envelope=self.plan.envelope
            )
            try:
                self.run.create()
                if store is not None:
                    store.set(JOB_STATE_KEY, {"name": layout.name, "namespace": layout.namespace})
            except BaseException:
                self.run.cleanup()
                raise
            queue = waiting_queue(job)  # created suspended: the trigger waits through Kueue's admission too
            if queue is not None:
                self.log.info("%s", waiting_line(f"Indexed Job {layout.namespace}/{layout.name}", queue))
        options = self.plan.options
        trigger = KubernetesJobTrigger(
            job_name=layout.name,
            job_namespace=layout.namespace,
            pod_names=[],  # rank 0 is found by the Job's label when the task resumes
            pod_namespace=layout.namespace,
            base_container_name=MAIN_CONTAINER,
            kubernetes_conn_id=options.kubernetes_conn_id,
            poll_interval=POLL_INTERVAL,
            cluster_context=options.cluster_context,
            config_file=options.config_file,
            in_cluster=options.in_cluster,
            get_logs=False,  # the trigger prints no log: resume does
            do_xcom_push=False,  # the result is rank 0's last log line
        )
        state = {"job": {"name": layout.name, "namespace": layout.namespace}}
        timeout = deadline + DEADLINE_MARGIN if deadline is not None else None
        self.log.info("Indexed Job %s/%s submitted; the task defers", layout.namespace, layout.name)
        return Deferral(trigger=trigger, state=state, timeout=timeout)

    def _running_job(
        self, hook: KubernetesHook, stored: Any, namespace: str, ours: Mapping[str, Any]
    ) -> MultiNodeLayout | None:
        """The layout of the Job an earlier try submitted, if it still runs (else it is deleted, with its Service).

        :param namespace: the namespace this try's Job would have; another's Job is never taken
        :param ours: the Job this try would submit: the earlier one must carry its task instance's labels
        """
        if not isinstance(stored, dict) or not all(isinstance(stored.get(k), str) for k in ("name", "namespace")):
            return None
        if stored["namespace"] != namespace:
            self.log.warning("The recorded Job %s is in another namespace than this task's: it is left", stored)
            return None
        layout = MultiNodeLayout(stored["name"], stored["namespace"], self.plan.num_nodes, self.plan.port)
        try:
            job = hook.batch_v1_client.read_namespaced_job_status(layout.name, layout.namespace)
        except ApiException as err:
            if err.status != 404:
                raise
            return None
        labels, wanted = (job.metadata.labels or {}), ours["metadata"].get("labels") or {}
        if any(labels.get(key) != wanted.get(key) for key in IDENTITY_LABELS if key in wanted) or not wanted:
            self.log.warning("The recorded Job %s/%s is not this task instance's: it is left", layout.namespace,
                             layout.name)  # fmt: skip
            return None
        if hook.is_job_complete(job):
            IndexedJobRun.attach(hook, layout, log=self.log, claim=self.plan.claim).cleanup()  # over: its try's
            return None
        self.log.info("Taking over Indexed Job %s/%s, submitted by an earlier try", layout.namespace, layout.name)
        return layout

    def resume(self, state: dict[str, Any], event: Any, context: Context) -> TaskResult:
        """Collect rank 0's result after KubernetesJobTrigger's event; delete the Job and its Service."""
        job = state.get("job") or {}
        event = event if isinstance(event, dict) else {}
        layout = MultiNodeLayout(job["name"], job["namespace"], self.plan.num_nodes, self.plan.port)
        self.run = run = IndexedJobRun.attach(self._hook(), layout, log=self.log, claim=self.plan.claim)
        where = f"Job {layout.name} (rank 0)"
        try:
            result = run.rank0_result(print_log=True)
            if event.get("status") == "success":
                return task_result(result, 0, where=where)
            if result is not None and not result.get("ok"):
                return task_result(result, 1, where=where)  # raises the user's exception, as run() does
            killed = run.killed_rank(self.plan.resources.get("limits", {}))
            if killed is not None:
                raise killed
            message = event.get("message") or f"the trigger's event {event!r}"
            if "DeadlineExceeded" in message:
                message += " (the task's execution_timeout, the Job's activeDeadlineSeconds)"
            raise GpuTaskError(f"Job {layout.namespace}/{layout.name} failed: {message}")
        finally:
            run.cleanup()

    def on_kill(self) -> None:
        """Delete the Job, its pods and the Service."""
        if self.run is not None:
            self.run.kill()


def _deadline(context: Context) -> datetime.timedelta | None:
    """What is left of the task's ``execution_timeout`` (counted from the try's start, as KubernetesPodOperator)."""
    timeout = execution_timeout(context)
    if timeout is None:
        return None
    start = getattr(context.get("ti"), "start_date", None)
    if not isinstance(start, datetime.datetime):
        return datetime.timedelta(seconds=max(int(timeout.total_seconds()), 1))
    left = start.timestamp() + timeout.total_seconds() - time.time()
    return datetime.timedelta(seconds=max(int(left), 1))  # whole seconds: the Job's activeDeadlineSeconds
