"""How a GPU operator runs a try: in the worker, or deferred (``deferrable=True``), and taken over by a later try.

``execute`` plans the try and runs it on its backend, or, deferred, starts it (``Backend.start``) and hands it to the
backend's trigger; ``execute_complete`` resumes it on a worker (``Backend.resume``). A wait for GPUs
(``on_missing_gpu="wait"``) is deferred on every host backend: the allocator raises ``MustWait`` and the task waits
in the triggerer (:class:`~airflow_gpu_provider.host.trigger.GpuFreeTrigger`), then starts again. ``durable`` lets
a later try take over what an earlier one left running: a synchronous run on a resumable backend (Docker) goes through
Airflow's ``ResumableJobMixin.execute_resumable`` (:mod:`.durable`). docs/deferrable.md says what each backend frees.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from airflow.providers.common.compat.sdk import AirflowFailException  # airflow.sdk.exceptions from 3.2

from airflow_gpu_provider.escalation.retry_policy import DefaultRetryPolicy
from airflow_gpu_provider.exceptions import GpuUnavailableError, RemoteTaskError
from airflow_gpu_provider.operators.durable import DurableJob

if TYPE_CHECKING:
    from airflow.sdk import Context
    from airflow.triggers.base import BaseTrigger

    from airflow_gpu_provider.backends.base import Backend, Deferral
    from airflow_gpu_provider.config.worker import GpuConfig
    from airflow_gpu_provider.escalation.tries import Tries
    from airflow_gpu_provider.host.waiting import MustWait
    from airflow_gpu_provider.operators.spec import TaskSpec
    from airflow_gpu_provider.settings.escalation import OomEscalation
    from airflow_gpu_provider.task.request import TaskRequest
    from airflow_gpu_provider.task.result import TaskResult


class Attempt(NamedTuple):
    """One try, built once when it starts: the worker's options, the task, its rung, request, backend and plan.

    A deferred try travels in the deferral's state (:meth:`carried`) and is rebuilt from it on resume, not anew.
    """

    conf: GpuConfig
    spec: TaskSpec
    tries: Tries | None
    request: TaskRequest
    backend: Backend[Any, Any]
    plan: Any

    def carried(self) -> dict[str, Any]:
        """What the try decided when it started, as JSON: the worker's options and the request (its rung too)."""
        return {"conf": dataclasses.asdict(self.conf), "request": self.request.to_state()}


class GpuExecution(DurableJob):
    """``execute`` / ``execute_complete`` of the GPU operators.

    As their settled ``deferrable``, ``durable`` and ``wait_timeout`` say: ``TaskSpec`` holds the operator's
    arguments; this mixin has none of its own (``durable`` is Airflow's ``ResumableJobMixin`` attribute, set from the
    settled task).
    """

    task_spec: TaskSpec
    log: Any
    retry_policy = DefaultRetryPolicy()  # the DAG's retry_policy, else GpuRetryPolicy() (Airflow 3.3+)
    _running_backend: Backend[Any, Any] | None = None  # the backend of the step under way (on_kill stops it)
    _waiting_since: float | None = None  # set by a resume after a deferred wait for GPUs

    @property
    def deferrable(self) -> bool:
        """Whether a try runs deferred where its backend can, and defers its wait for GPUs."""
        return self.task_spec.deferrable

    @property
    def wait_timeout(self) -> float | None:
        """Seconds a wait for GPUs lasts (``None``: ``[gpu] wait_timeout``)."""
        return self.task_spec.wait_timeout

    @property
    def on_oom(self) -> OomEscalation | None:
        """The task's ``on_oom`` ladder (as settled: :attr:`task_spec` holds the task's every setting)."""
        return self.task_spec.on_oom

    @property
    def resume(self) -> bool:
        """Whether each try resumes from the newest checkpoint of its folder (``resume=True``)."""
        return self.task_spec.resume

    if TYPE_CHECKING:  # the operator's (GpuStepOperator, BaseOperator)
        gpu_profile: Any

        def rendered_spec(self, *, backend: str | None = None) -> TaskSpec: ...  # noqa: D102

        def task_request(  # noqa: D102
            self, context: Context, spec: TaskSpec, conf: GpuConfig, tries: Tries | None = None
        ) -> TaskRequest: ...

        def defer(  # noqa: D102
            self,
            *,
            trigger: BaseTrigger,
            method_name: str,
            kwargs: dict[str, Any] | None = None,
            timeout: timedelta | float | None = None,
        ) -> NoReturn: ...

    def _prepare(self, context: Context) -> Attempt:
        """The try, settled: the worker's options, the rendered task, its rung, its request, backend and plan."""
        from airflow_gpu_provider.config.worker import GpuConfig

        conf = GpuConfig.read(**({"wait_timeout": self.wait_timeout} if self.wait_timeout else {}))
        spec = self.rendered_spec()  # a templated backend's deferrable is checked there
        tries = None
        if spec.on_oom is not None:  # the ladder's modules load only for a task that has one
            from airflow_gpu_provider.escalation import tries as escalation

            tries = escalation.Tries.start(spec.on_oom, context)
        request = self.task_request(context, spec, conf, tries)
        waits_deferred = self.deferrable and request.missing_gpu.waits
        request = dataclasses.replace(request, durable=spec.durable, defer_wait=waits_deferred)
        backend = spec.info.backend_class()(spec.options, log=self.log)
        return Attempt(conf, spec, tries, request, backend, backend.plan(request, conf))

    def _resumed(self, context: Context, carried: Mapping[str, Any]) -> Attempt:
        """The try a deferral carried (:meth:`Attempt.carried`): its options and request as they started.

        The task and its backend are the DAG's; the plan is a pure function of the request and the options.
        """
        from airflow_gpu_provider.config.worker import GpuConfig
        from airflow_gpu_provider.escalation import tries as escalation
        from airflow_gpu_provider.task.request import TaskRequest

        conf = GpuConfig.from_state(carried["conf"])
        spec = self.rendered_spec()
        request = TaskRequest.from_state(carried["request"], spec.image)
        tries = escalation.Tries.start(spec.on_oom, context) if spec.on_oom is not None else None  # to record the end
        backend = spec.info.backend_class()(spec.options, log=self.log)
        return Attempt(conf, spec, tries, request, backend, backend.plan(request, conf))

    def execute(self, context: Context) -> Any:
        """Plan the task on its backend and run it (or start it and defer); the return value goes to XCom."""
        from airflow_gpu_provider.backends.base import ResumableBackend

        waiting_since, self._waiting_since = self._waiting_since, None  # set by a resume after a deferred wait
        attempt = self._prepare(context)
        request, plan, backend = attempt.request, attempt.plan, attempt.backend
        self.log.info(
            "GPU task %s on backend %r: %s; requirements %s; on_missing_gpu=%s%s",
            request.display_name,
            attempt.spec.backend,
            request.resources.describe(),
            request.image.requirements_hash,
            request.on_missing_gpu,
            "; deferrable" if self.deferrable else "",
        )
        if request.checkpoint is not None and request.checkpoint.is_uri:  # a path root: the backend makes it
            request.checkpoint.make(request.labels)  # the run folder marked: what the scheduler may delete (F2)
        if self.deferrable and attempt.spec.info.defers:
            return self._outcome(context, attempt, lambda: backend.start(plan, context), waiting_since)
        if isinstance(backend, ResumableBackend):  # Airflow's durable contract: a later try reconnects to the job
            self._job, self.external_id_key = (backend, plan), backend.state_key
            return self._outcome(context, attempt, lambda: self.execute_resumable(context), waiting_since)
        return self._outcome(context, attempt, lambda: backend.run(plan, context), waiting_since)

    def execute_complete(
        self, context: Context, event: Mapping[str, Any] | None = None, state: Mapping[str, Any] | None = None
    ) -> Any:
        """Back on a worker after the trigger fired: collect the run, or start it now that GPUs are free.

        :param state: what ``defer`` was given; the provider's own triggers echo it in their event as well
        """
        event = dict(event or {})
        state = dict(state or event.get("state") or {})
        if state.get("phase") == "wait":
            since = float(state["since"])
            if event.get("status") != "free":
                from airflow_gpu_provider.host.waiting import waited_too_long

                waited = time.time() - since
                limit = float(state.get("limit", waited))  # a deferral of an older release has no limit
                busy = f"{event.get('free', 0)} free of those that would do, {state.get('count', 'more')} needed"
                raise GpuUnavailableError(waited_too_long(str(state["requested"]), waited, limit, busy))
            self.log.info("GPUs free after %.1fs of deferred waiting: starting the task", event.get("waited", 0.0))
            self._waiting_since = since  # execute() is the decorator's too: it takes the context alone
            return self.execute(context)
        # the try as it started; dag.test() passes the trigger's event alone, without the deferral's state
        attempt = self._resumed(context, state["try"]) if "try" in state else self._prepare(context)
        backend_state = dict(state.get("backend") or {})
        step = lambda: attempt.backend.resume(attempt.plan, backend_state, event, context)  # noqa: E731
        return self._outcome(context, attempt, step, None)

    def _outcome(self, context: Context, attempt: Attempt, step: Any, waiting_since: float | None) -> Any:
        """Run ``step`` (run, start or resume); defer, or publish the profile and the try's outcome."""
        from airflow_gpu_provider.backends.base import Deferral
        from airflow_gpu_provider.host.waiting import MustWait

        self._running_backend = attempt.backend
        try:
            try:
                outcome: TaskResult | Deferral | MustWait = step()
            except MustWait as wait:
                outcome = wait
        except BaseException as err:
            self._running_backend = self._job = None
            if isinstance(err, RemoteTaskError) and err.remote_traceback:  # the user's traceback, once, at ERROR
                self.log.error("%s", err.remote_traceback.rstrip())
            self._publish(context, attempt, err)
            self._infrastructure(context, attempt, err)
            if isinstance(err, GpuUnavailableError) and attempt.request.min_gpu_memory is not None:
                raise AirflowFailException(str(err)) from err  # no GPU of this host is larger: retrying cannot help
            if isinstance(err, RemoteTaskError):  # the task's own traceback is above: not the provider's frames
                raise err.with_traceback(None)  # noqa: B904 - the same error
            raise
        self._running_backend = self._job = None
        if isinstance(outcome, MustWait):  # nothing is published for a deferred try
            self._defer_wait(outcome, attempt.conf, waiting_since)
        elif isinstance(outcome, Deferral):
            state = {"phase": "run", "backend": outcome.state, "try": attempt.carried()}
            self.defer(
                trigger=outcome.trigger,
                method_name="execute_complete",
                kwargs={"state": state},
                timeout=outcome.timeout,
            )
        self._publish(context, attempt, None, outcome.profile)
        return outcome.return_value

    def _publish(
        self,
        context: Context,
        attempt: Attempt,
        failure: BaseException | None,
        profile: Mapping[str, Any] | None = None,
    ) -> None:
        """The try is over: its profile (``gpu_profile``) and, with an ``on_oom`` ladder, how it ended."""
        from airflow_gpu_provider.telemetry import report

        request = attempt.request
        if isinstance(failure, RemoteTaskError):
            profile = failure.profile
        self.gpu_profile = report.publish(
            profile,
            request,
            str(attempt.spec.backend),
            context=context,
            log=self.log,
            conf=attempt.conf,
            failure=failure,
        )
        if attempt.tries is not None:
            from airflow_gpu_provider.escalation import tries as escalation

            context["ti"].xcom_push(escalation.XCOM_KEY, attempt.tries.finish(request.resources, failure))

    def _infrastructure(self, context: Context, attempt: Attempt, error: BaseException) -> None:
        """An infrastructure failure: said, its node kept for the next try, run again (``[gpu] infra_retries``)."""
        from airflow_gpu_provider.escalation import infrastructure

        failure = infrastructure.failure_of(error)
        if failure is not None:
            infrastructure.report(context, failure, self.log, avoid_node=attempt.spec.info.avoids_nodes)
            infrastructure.run_again(context, attempt.conf.infra_retries, self.log)

    def _defer_wait(self, wait: MustWait, conf: GpuConfig, waiting_since: float | None) -> NoReturn:
        """Wait for GPUs in the triggerer: the task holds no worker slot and no GPU while it waits."""
        from airflow_gpu_provider.host.trigger import GpuFreeTrigger

        since = time.time() if waiting_since is None else waiting_since
        self.log.info(
            "%s. Deferred until they are free (on_missing_gpu='wait', deferrable=True; for at most %.0fs more).",
            wait,
            since + wait.timeout - time.time(),
        )
        trigger = GpuFreeTrigger(
            wait.lock_files,
            wait.count,
            since + wait.timeout,
            poll_interval=conf.poll_interval,
            requested=wait.requested,
            since=since,
            parts=wait.parts,
        )
        state = {"phase": "wait", "since": since, "requested": wait.requested, "limit": wait.timeout}
        state["count"] = wait.count
        self.defer(trigger=trigger, method_name="execute_complete", kwargs={"state": state})

    def on_kill(self) -> None:
        """Stop the child process, container or pod of this try."""
        if self._running_backend is not None:
            self._running_backend.kill()
