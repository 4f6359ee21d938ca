"""The Ray backend: one task try is one Ray job, submitted through Ray's Jobs API (``JobSubmissionClient``).

``plan()`` maps the request to the job (pure, :mod:`.plan`); ``run()`` submits it with the runtime and the envelope
in its ``working_dir``, follows its log into the task log, reads its result and deletes it, stopping it on every
path that leaves it running (:mod:`.job`). ``start()`` does the same up to the submission and defers to
:class:`.trigger.RayJobTrigger`; ``resume()`` collects. A job an earlier try of the task instance left is taken over
instead of submitted again (:mod:`.durable`). On several machines the job's entrypoint is the node driver
(:mod:`.nodes`). docs/ray.md says what each setting becomes.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from typing import TYPE_CHECKING, Any

from airflow_gpu_provider.backends.base import Backend, Deferral
from airflow_gpu_provider.backends.ray import durable, job
from airflow_gpu_provider.backends.ray.capacity import infeasible
from airflow_gpu_provider.backends.ray.connection import Endpoint, endpoint
from airflow_gpu_provider.backends.ray.options import RayOptions
from airflow_gpu_provider.backends.ray.orphans import reap_orphans
from airflow_gpu_provider.backends.ray.plan import RayPlan, plan_job
from airflow_gpu_provider.exceptions import GpuTaskError, GpuUnavailableError
from airflow_gpu_provider.task.request import TaskRequest
from airflow_gpu_provider.task.result import TaskResult

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_gpu_provider.config.worker import GpuConfig


class _Pending(Exception):
    """The job waited ``pending_timeout`` for the cluster's resources (it was stopped and deleted)."""


class RayBackend(Backend[RayOptions, RayPlan]):
    """Run each task try as a Ray job asking for the task's GPUs (or a share of one), CPUs and memory."""

    name = "ray"

    def __init__(self, options: RayOptions, log: Any = None) -> None:
        super().__init__(options, log)
        self._client: Any = None
        self._endpoint = Endpoint("")
        self._job: str | None = None  # the running job's submission id, for kill()
        self._killed = False
        self._store: Any = None  # the task instance's task state store (Airflow >= 3.3)
        self._deadline: float | None = None  # when a deferred job times out
        self._fallback_reason = ""  # why the task runs on the CPU (on_missing_gpu="cpu")

    def plan(self, request: TaskRequest, conf: GpuConfig) -> RayPlan:
        """Translate the request into the job (:func:`.plan.plan_job`)."""
        return plan_job(request, self.options, conf)

    def _connect(self, context: Context) -> Any:
        self._endpoint = endpoint(self.options.ray_conn_id, self.options.address)
        self._client = self._endpoint.jobs()
        self._store = context.get("task_state_store")
        return self._client

    # ------------------------------------------------------------------ run
    def run(self, plan: RayPlan, context: Context) -> TaskResult:
        """Submit the job, follow it to its end, return its result; stop and delete it on every path."""
        outcome = self._go(plan, context, defer=False)
        assert isinstance(outcome, TaskResult)  # without defer, never a Deferral
        return outcome

    def start(self, plan: RayPlan, context: Context) -> TaskResult | Deferral:
        """As :meth:`run`, up to the submission; then the task defers to the job's trigger."""
        timeout = context["task"].execution_timeout
        self._deadline = None if timeout is None else time.time() + timeout.total_seconds()
        return self._go(plan, context, defer=True)

    def _go(self, plan: RayPlan, context: Context, *, defer: bool) -> TaskResult | Deferral:
        location = plan.request.checkpoint
        if location is not None and not location.is_uri and os.path.isdir(location.root):
            location.make(plan.request.labels)  # a shared file system: made and marked here, the run's cleanup's
        client = self._connect(context)
        reap_orphans(client, self.log)  # before this job asks for GPUs: a dead worker's job may still hold them
        earlier = self._earlier_job(client, plan)
        if earlier is not None:
            return self._reattach(client, plan, earlier, defer=defer)
        # ``wait`` leaves an infeasible job to Ray (an autoscaler may add the node it needs)
        checked = plan.request.resources.requests_gpus and not plan.request.missing_gpu.waits
        why = infeasible(self._endpoint, plan) if checked else None
        if why is not None:
            plan = self._missing_gpus(plan, why, waited=False)
        try:
            return self._submit(client, plan, defer=defer)
        except _Pending as pending:
            return self._submit(client, self._missing_gpus(plan, str(pending), waited=True), defer=defer)

    def _missing_gpus(self, plan: RayPlan, why: str, *, waited: bool) -> RayPlan:
        """``on_missing_gpu``: the CPU-only plan (``cpu``), or a :class:`GpuUnavailableError`."""
        if plan.cpu_fallback is not None:
            self.log.warning("%s. on_missing_gpu='cpu': running on CPU instead.", why)
            self._fallback_reason = why
            return plan.cpu_fallback
        hint = "" if waited else " on_missing_gpu='wait' leaves it to the cluster (an autoscaler may add nodes)."
        raise GpuUnavailableError(f"{why}.{hint} Set on_missing_gpu='cpu' to run on CPU instead.")

    def _submit(self, client: Any, plan: RayPlan, *, defer: bool) -> TaskResult | Deferral:
        """Submit the job; follow it to its end, or hand it to a trigger (``defer``)."""
        for note in plan.notes:
            self.log.warning("%s", note)
        labels = plan.request.labels
        identity = hashlib.sha256(repr(sorted(labels.items())).encode()).hexdigest()[:10]
        submission_id = f"airflow-gpu-{identity}-{labels.get('try_number', 0)}-{uuid.uuid4().hex[:8]}"
        envelope = plan.request.runtime_envelope(
            backend=self.name,
            image=f"Ray cluster {self._endpoint.address}",
            gpus=None,
            cpu_fallback=plan.on_cpu,
            fallback_reason=self._fallback_reason if plan.on_cpu else "",
        )
        durable.RECORD.record(self._store, submission_id, durable.cluster_of(self.options), plan.try_number)
        self._job, self._killed, handed_over = submission_id, False, False
        try:
            durable_job = defer or (plan.request.durable and self._store is not None)  # may outlive this worker
            job.submit(client, plan, envelope, submission_id, self.log, durable=durable_job)
            if defer:
                handed_over = True
                return self._deferral(plan, submission_id)
            if job.wait_while_pending(client, submission_id, plan.pending_timeout, plan.poll_interval) == "PENDING":
                raise _Pending(
                    f"Ray job {submission_id} waited {plan.pending_timeout:.0f}s for "
                    f"{plan.request.resources.describe()} on the cluster (pending_timeout)"
                )
            return self._finish(client, plan, submission_id, job.follow(client, submission_id, self.log))
        finally:
            self._job = None
            if not handed_over:
                self._clean_up(client, plan, submission_id)

    def _finish(self, client: Any, plan: RayPlan, submission_id: str, result: dict[str, Any] | None) -> TaskResult:
        """The ended job's outcome, with the node it ran on in the log and the profile."""
        info = job.ended(client, submission_id)
        node = job.node_of(self._endpoint, info, result)
        self.log.info("Ray job %s ended %s on node %s", submission_id, info.status, node)
        if self._killed:
            raise GpuTaskError(f"Ray job {submission_id} was stopped because the task was killed.")
        if result is not None and isinstance(result.get("profile"), dict):
            result = {**result, "profile": {**result["profile"], "node": f"ray node {node}"}}
        return job.outcome(info, result)

    def _clean_up(self, client: Any, plan: RayPlan, submission_id: str) -> None:
        """Stop the job if it runs, delete it, forget it; unless a later try took it over."""
        if durable.RECORD.owns(self._store, submission_id, plan.try_number, self.log):
            job.stop(client, submission_id)
            job.delete(client, submission_id, self.log)
            durable.RECORD.forget(self._store, submission_id)

    def _deferral(self, plan: RayPlan, submission_id: str) -> Deferral:
        """The trigger that waits for the job, reaching the cluster as this worker did."""
        from airflow_gpu_provider.backends.ray.trigger import RayJobTrigger

        cluster = {"ray_conn_id": self.options.ray_conn_id, "address": self.options.address}
        self.log.info("Deferred: the triggerer watches Ray job %s (%s)", submission_id, self._endpoint.address)
        state = {"submission_id": submission_id}
        pending = time.time() + plan.pending_timeout if plan.request.resources.requests_gpus else None
        trigger = RayJobTrigger(submission_id, cluster, plan.poll_interval, self._deadline, pending, state=state)
        return Deferral(trigger, state)

    def resume(self, plan: RayPlan, state: dict[str, Any], event: Any, context: Context) -> TaskResult | Deferral:
        """After the trigger fired: log the job's output, read its result, delete it."""
        client = self._connect(context)
        submission_id, status = str(state["submission_id"]), (event or {}).get("status")
        if status == "missing":
            durable.RECORD.forget(self._store, submission_id)
            raise GpuTaskError(f"Ray job {submission_id} was deleted while the task was deferred: its result is lost.")
        if not self._mine(client, plan, submission_id):  # a deferral's state is data a task wrote
            raise GpuTaskError(f"Ray job {submission_id} is not this task instance's job: it is left alone.")
        if status == "pending":
            why = f"Ray job {submission_id} waited {plan.pending_timeout:.0f}s for the cluster's resources"
            self._clean_up(client, plan, submission_id)
            return self._submit(client, self._missing_gpus(plan, why, waited=True), defer=True)
        try:
            if status == "timeout":
                self.log.warning("The task timed out while deferred: stopping Ray job %s", submission_id)
                job.stop(client, submission_id)
                job.log_all(client, submission_id, self.log)
                from airflow.providers.common.compat.sdk import AirflowTaskTimeout

                raise AirflowTaskTimeout(f"Timeout: Ray job {submission_id} outlived the task's execution_timeout")
            return self._finish(client, plan, submission_id, job.log_all(client, submission_id, self.log))
        finally:
            self._clean_up(client, plan, submission_id)

    @staticmethod
    def _mine(client: Any, plan: RayPlan, submission_id: str) -> bool:
        """Whether the job (if the cluster still has it) is this task instance's, of this deployment."""
        if job.status(client, submission_id) is None:
            return True
        return durable.mine(client.get_job_info(submission_id).metadata, plan.request.labels)

    # ------------------------------------------------------------------ reattach
    def _earlier_job(self, client: Any, plan: RayPlan) -> Any:
        """The job an earlier try of this task instance left on this cluster, to take over; else ``None``.

        With ``durable=False`` it is stopped and deleted, and the task starts afresh.
        """
        record = durable.RECORD.recorded(self._store, durable.cluster_of(self.options))
        submission_id = None if record is None else str(record["id"])
        if submission_id is None or job.status(client, submission_id) is None:
            return None
        info = client.get_job_info(submission_id)
        if not durable.mine(info.metadata, plan.request.labels):
            return None
        if plan.request.durable:
            return info
        self.log.warning("Stopping Ray job %s left by an earlier try of this task (durable=False)", submission_id)
        job.stop(client, submission_id)
        job.delete(client, submission_id, self.log)
        durable.RECORD.forget(self._store, submission_id)
        return None

    def _reattach(self, client: Any, plan: RayPlan, info: Any, *, defer: bool) -> TaskResult | Deferral:
        """Take over the job of an earlier try: defer to it, or follow it and collect its result."""
        submission_id, status = str(info.submission_id), str(info.status)
        self.log.info(
            "Reattached to Ray job %s, %s by an earlier try of this task instance (reattach=True): its output follows",
            submission_id,
            "ended" if status in job.TERMINAL else "left running",
        )
        durable.RECORD.record(self._store, submission_id, durable.cluster_of(self.options), plan.try_number)
        if defer and status not in job.TERMINAL:
            return self._deferral(plan, submission_id)
        self._job, self._killed = submission_id, False
        try:
            return self._finish(client, plan, submission_id, job.follow(client, submission_id, self.log))
        finally:
            self._job = None
            self._clean_up(client, plan, submission_id)

    def kill(self) -> None:
        """Called from ``on_kill``: stop the job (Ray sends SIGTERM, then SIGKILL)."""
        submission_id, client = self._job, self._client
        if submission_id is None or client is None:
            return
        self._killed = True
        self.log.info("Stopping Ray job %s", submission_id)
        job.stop(client, submission_id, timeout=30)
