"""The Slurm backend: one task try is one batch job, on the job wing that Docker shares (``backends/jobs/``).

``plan()`` maps the request (pure, :mod:`.plan`). A synchronous run is Airflow's durable contract
(:class:`~..base.ResumableBackend`): ``submit()`` writes the job's folder on the shared folder and submits it
(:mod:`.job`, through the submit host's commands or slurmrestd: :mod:`.connection`), recording it in the task state
store; ``follow()`` logs its output and why it waits, reads its end and its result, and removes its folder. A later
try takes over the job an earlier one recorded instead of submitting another; a job Slurm requeues keeps its id, and
the same try follows it. ``start()`` submits and defers to :class:`.trigger.SlurmJobTrigger`; ``resume()`` collects.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from airflow_gpu_provider.backends.base import Deferral, ResumableBackend
from airflow_gpu_provider.backends.jobs.durable import JobRecord
from airflow_gpu_provider.backends.slurm import job, orphans
from airflow_gpu_provider.backends.slurm.clients import client
from airflow_gpu_provider.backends.slurm.connection import Cluster, cluster
from airflow_gpu_provider.backends.slurm.options import SlurmOptions
from airflow_gpu_provider.backends.slurm.placement import avoided, time_limit
from airflow_gpu_provider.backends.slurm.plan import SlurmPlan, directives, job_share, plan_job
from airflow_gpu_provider.backends.slurm.states import ACTIVE, JobInfo, ended_error
from airflow_gpu_provider.exceptions import GpuTaskError, GpuUnavailableError
from airflow_gpu_provider.task.request import TaskRequest
from airflow_gpu_provider.task.result import TaskResult, task_result

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_gpu_provider.config.worker import GpuConfig

RECORD = JobRecord("airflow_gpu_provider.slurm_job", "Slurm job", "cluster", valid_id=str.isdigit)


class SlurmBackend(ResumableBackend[SlurmOptions, SlurmPlan]):
    """Run each task try as a Slurm batch job with the task's GPUs (GRES), CPUs, memory and time."""

    name = "slurm"
    state_key = RECORD.key

    def __init__(self, options: SlurmOptions, log: Any = None) -> None:
        super().__init__(options, log)
        self._facts: Cluster | None = None
        self._client: Any = None
        self._store: Any = None
        self._timeout_s: float | None = None
        self._job: str | None = None  # the job followed now, which kill() cancels
        self._killed = False
        self._fallback_reason = ""

    def plan(self, request: TaskRequest, conf: GpuConfig) -> SlurmPlan:
        """Translate the request (:func:`.plan.plan_job`); what it names of the cluster checked against the policy."""
        from airflow_gpu_provider.policy import Policy
        from airflow_gpu_provider.policy.slurm import check_cluster, check_names

        policy = Policy.of(conf)
        check_cluster(request.display_name, self.options.slurm_conn_id, policy)
        check_names(request.display_name, self.options.cluster_names, policy)
        return plan_job(request, self.options, conf)

    def _open(self, context: Context) -> Any:
        """The cluster's client, once per try: the jobs a dead worker of this host left are cancelled first."""
        if self._client is None:
            self._facts = cluster(self.options.slurm_conn_id)
            self._client = client(self._facts)
            self._store = context.get("task_state_store")
            timeout = context["task"].execution_timeout
            self._timeout_s = None if timeout is None else timeout.total_seconds()
            orphans.reap_orphans(self._client, self._facts.shared_dir, self.log)
        return self._client

    @property
    def facts(self) -> Cluster:
        """The cluster's facts (read by :meth:`_open`)."""
        assert self._facts is not None, "_open() reads the connection first"
        return self._facts

    # ------------------------------------------------------------------ the synchronous run (durable)
    def submit(self, plan: SlurmPlan, context: Context) -> dict[str, Any]:
        """Submit the job (an earlier try's that no try takes over is cancelled first); its record."""
        self._open(context)
        self._cancel_earlier(plan)
        durable = plan.request.durable and self._store is not None
        return self._submit(plan, durable=durable)

    def _submit(self, plan: SlurmPlan, *, durable: bool) -> dict[str, Any]:
        facts, request = self.facts, plan.request
        location = request.checkpoint
        if location is not None and not location.is_uri and os.path.isdir(location.root):
            location.make(request.labels)  # a shared file system: made and marked here, the run's cleanup's
        envelope = request.runtime_envelope(
            backend=self.name,
            image=f"Slurm cluster {facts.name} ({facts.python})",
            gpus=None,
            cpu_fallback=plan.on_cpu,
            fallback_reason=self._fallback_reason if plan.on_cpu else "",
            share=job_share(plan, facts, self.log),
        )
        nodes = self._client.nodes() if request.avoid_nodes else []  # asked only after a try failed on a node
        avoid = avoided(plan, nodes, facts, self.log)
        folder = job.make_folder(plan, facts.shared_dir, facts.python, envelope)
        found = directives(
            plan, facts, folder=folder, comment=orphans.comment(request.labels, durable=durable), avoid=avoid
        )
        found.update(time_limit(self._timeout_s))
        environment = {"PATH": facts.path, "HOME": "/tmp", **plan.environment}  # nothing of the worker's
        try:
            job_id = self._client.submit(f"{folder}/job.sh", found, environment)
        except GpuUnavailableError as err:
            job.remove_folder(folder)
            why = f"{err}: no partition of the cluster can ever run {request.resources.describe()}"
            if plan.cpu_fallback is None:
                raise GpuUnavailableError(f"{why}. Set on_missing_gpu='cpu' to run on CPU instead.") from None
            return self._on_cpu(plan, why, durable=durable)
        except BaseException:
            job.remove_folder(folder)
            raise
        RECORD.record(self._store, job_id, facts.name, plan.try_number, folder=folder)
        self.log.info("Submitted Slurm job %s to %s: %s", job_id, facts.name, " ".join(_shown(found)))
        return RECORD.entry(job_id, facts.name, plan.try_number, folder=folder)

    def _on_cpu(self, plan: SlurmPlan, why: str, *, durable: bool) -> dict[str, Any]:
        assert plan.cpu_fallback is not None
        self.log.warning("%s. on_missing_gpu='cpu': running on CPU instead.", why)
        self._fallback_reason = why
        return self._submit(plan.cpu_fallback, durable=durable)

    def job_status(self, plan: SlurmPlan, record: Any, context: Context) -> str:
        """The recorded job's state (``RUNNING``, ``COMPLETED``, ...); ``missing`` when it is not this task's."""
        self._open(context)
        checked = RECORD.checked(record, self.facts.name)
        folder = None if checked is None else job.own_folder(self.facts.shared_dir, checked.get("folder"))
        if checked is None or folder is None:
            return "missing"
        info = self._client.job(checked["id"])
        if info is not None:
            return info.state if orphans.mine(info.comment, plan.request.labels) else "missing"
        ended = self._client.accounting(checked["id"]) or job.exit_record(folder, checked["id"])
        return "missing" if ended is None else ended.state

    def job_active(self, status: str) -> bool:
        """The job may still run: a later try follows it."""
        return status in ACTIVE

    def job_succeeded(self, status: str) -> bool:
        """The job completed: a later try collects its result."""
        return status == "COMPLETED"

    def follow(self, plan: SlurmPlan, record: Any, context: Context) -> TaskResult:
        """Log the job's output to its end, read its result, remove its folder (unless a later try took it over)."""
        self._open(context)
        job_id, folder = self._take(plan, record)
        self._job, self._killed = job_id, False
        try:
            info = job.follow(
                self._client, job_id, folder, self.log,
                poll=plan.poll_interval, pending_timeout=plan.pending_timeout, stopped=lambda: self._killed,
            )  # fmt: skip
        except job.Pending as pending:
            self._clean_up(plan, job_id, folder)
            if plan.cpu_fallback is None:
                raise GpuUnavailableError(f"{pending}. Set on_missing_gpu='cpu' to run on CPU instead.") from None
            return self.follow(
                plan.cpu_fallback, self._on_cpu(plan, str(pending), durable=plan.request.durable), context
            )
        except BaseException:
            self._job = None
            self._clean_up(plan, job_id, folder)
            raise
        self._job = None
        try:
            return self._collect(plan, info, folder)
        finally:
            self._clean_up(plan, job_id, folder)

    def _take(self, plan: SlurmPlan, record: Any) -> tuple[str, str]:
        """The recorded job and its folder, this try's from now on (its record names this try)."""
        checked = RECORD.checked(record, self.facts.name) or {}
        folder = job.own_folder(self.facts.shared_dir, checked.get("folder"))
        if folder is None:
            raise GpuTaskError(f"The Slurm job record {record!r} names no job folder of this worker's.")
        if checked.get("try") != plan.try_number:
            self.log.info("Reattached to Slurm job %s, left by an earlier try of this task instance", checked["id"])
            RECORD.record(self._store, checked["id"], self.facts.name, plan.try_number, folder=folder)
        return str(checked["id"]), folder

    def _collect(self, plan: SlurmPlan, info: JobInfo, folder: str) -> TaskResult:
        """The ended job's outcome: its state's class, else its result (as ``task/result.py`` reads every one)."""
        where = f"Slurm job {info.job_id}" + (f" on {info.node}" if info.node else "")
        self.log.info("%s ended %s", where, info.state)
        if self._killed:
            raise GpuTaskError(f"{where} was cancelled because the task was killed.")
        error = ended_error(info, cancelled_here=False, memory=plan.memory)
        if error is not None:
            raise error
        result = job.results(folder, plan.num_nodes)
        if result is not None and isinstance(result.get("profile"), dict):
            result = {**result, "profile": {**result["profile"], "node": f"slurm node {info.node}"}}
        return task_result(result, info.status or 0, where=where)

    def _clean_up(self, plan: SlurmPlan, job_id: str, folder: str) -> None:
        """Cancel the job if it runs, remove its folder, forget it; unless a later try took it over."""
        if not RECORD.owns(self._store, job_id, plan.try_number, self.log):
            return
        info = self._client.job(job_id)
        if info is not None and info.active:
            self.log.warning("Cancelling Slurm job %s", job_id)
            self._client.cancel(job_id)
        job.remove_folder(folder)
        RECORD.forget(self._store, job_id)

    def _cancel_earlier(self, plan: SlurmPlan) -> None:
        """Cancel the job an earlier try recorded that no try takes over (``durable=False``, or it failed)."""
        earlier = RECORD.recorded(self._store, self.facts.name)
        folder = None if earlier is None else job.own_folder(self.facts.shared_dir, earlier.get("folder"))
        if earlier is None or folder is None:
            return
        info = self._client.job(earlier["id"])
        if info is not None and info.active and orphans.mine(info.comment, plan.request.labels):
            self.log.warning("Cancelling Slurm job %s left by an earlier try of this task", earlier["id"])
            self._client.cancel(earlier["id"])
        job.remove_folder(folder)
        RECORD.forget(self._store)

    # ------------------------------------------------------------------ deferred
    def start(self, plan: SlurmPlan, context: Context) -> TaskResult | Deferral:
        """Submit (or take over an earlier try's running job), then defer to the job's trigger."""
        self._open(context)
        earlier = RECORD.recorded(self._store, self.facts.name) if plan.request.durable else None
        status = "missing" if earlier is None else self.job_status(plan, earlier, context)
        if earlier is not None and self.job_succeeded(status):
            return self.follow(plan, earlier, context)
        if earlier is not None and self.job_active(status):
            record = earlier
            self._take(plan, record)
        else:
            self._cancel_earlier(plan)
            record = self._submit(plan, durable=True)
        return self._deferral(plan, record)

    def _deferral(self, plan: SlurmPlan, record: dict[str, Any]) -> Deferral:
        from airflow_gpu_provider.backends.slurm.trigger import SlurmJobTrigger

        deadline = None if self._timeout_s is None else time.time() + self._timeout_s
        pending = time.time() + plan.pending_timeout if plan.gpus else None
        state = {"job_id": record["id"], "folder": record["folder"]}
        self.log.info("Deferred: the triggerer watches Slurm job %s (%s)", record["id"], self.facts.name)
        where = {"slurm_conn_id": self.options.slurm_conn_id}
        trigger = SlurmJobTrigger(str(record["id"]), where, plan.poll_interval, deadline, pending, state=state)
        return Deferral(trigger, state)

    def resume(self, plan: SlurmPlan, state: dict[str, Any], event: Any, context: Context) -> TaskResult | Deferral:
        """After the trigger fired: log the job's output, read its end and result, remove its folder."""
        self._open(context)
        job_id, status = str(state["job_id"]), (event or {}).get("status")
        folder = job.own_folder(self.facts.shared_dir, state.get("folder"))
        if folder is None:
            raise GpuTaskError(f"The deferred Slurm job {job_id}'s folder is not this worker's.")
        if status == "refused":
            raise GpuTaskError(f"Slurm job {job_id} is not this task's: its trigger watched nothing.")
        try:
            if status in ("timeout", "pending"):
                self._client.cancel(job_id)
                job.Output(folder, self.log).close()
                if status == "timeout":
                    from airflow.providers.common.compat.sdk import AirflowTaskTimeout

                    raise AirflowTaskTimeout(f"Timeout: Slurm job {job_id} outlived the task's execution_timeout")
                why = f"Slurm job {job_id} waited {plan.pending_timeout:.0f}s for {plan.request.resources.describe()}"
                if plan.cpu_fallback is None:
                    raise GpuUnavailableError(f"{why}. Set on_missing_gpu='cpu' to run on CPU instead.")
                return self._deferral(plan, self._on_cpu(plan, why, durable=True))
            info = job.follow(self._client, job_id, folder, self.log, poll=plan.poll_interval, pending_timeout=None)
            return self._collect(plan, info, folder)
        finally:
            self._clean_up(plan, job_id, folder)

    def kill(self) -> None:
        """Called from ``on_kill``: cancel the job (SIGTERM to its steps, SIGKILL after the cluster's KillWait)."""
        job_id, found = self._job, self._client
        if job_id is None or found is None:
            return
        self._killed = True
        self.log.info("Cancelling Slurm job %s", job_id)
        found.cancel(job_id)


def _shown(found: dict[str, str]) -> list[str]:
    return [f"--{k}={v}" if v else f"--{k}" for k, v in found.items() if k not in ("comment", "chdir", "output")]
