"""The Docker backend: the task runs in a container on a Docker engine, reached through ``DockerHook``.

``plan()`` maps the request to container arguments (pure, :mod:`.plan`). A synchronous run is Airflow's durable
contract (:class:`~..base.ResumableBackend`): ``submit()`` finds or builds the image (:mod:`.images`), takes the GPUs
from the host allocator when the engine is on this host, creates the container with the runtime and the envelope in
``/airflow-gpu`` (:mod:`.files`, :mod:`.launch`) and starts it; ``follow()`` streams its output to the task log, reads
the result back and removes the container (:mod:`.lifecycle`). A later try of the task instance reconnects to the
container recorded in the task state store (:mod:`.durable`) instead of starting another. ``start()`` does the same
up to the start and defers to :class:`.trigger.DockerContainerTrigger`; ``resume()`` collects.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from airflow_gpu_provider.backends.base import Deferral, ResumableBackend
from airflow_gpu_provider.backends.docker import durable, launch, lifecycle
from airflow_gpu_provider.backends.docker.client import connect, read_engine
from airflow_gpu_provider.backends.docker.engine_facts import EngineFacts, engine_facts
from airflow_gpu_provider.backends.docker.files import checkpoint_folder
from airflow_gpu_provider.backends.docker.lifecycle import ContainerOomError
from airflow_gpu_provider.backends.docker.options import DockerOptions
from airflow_gpu_provider.backends.docker.orphans import reap_orphans
from airflow_gpu_provider.backends.docker.plan import DockerPlan, plan_container
from airflow_gpu_provider.exceptions import GpuTaskError
from airflow_gpu_provider.task.request import TaskRequest
from airflow_gpu_provider.task.result import TaskResult

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_gpu_provider.config.worker import GpuConfig

__all__ = ["ContainerOomError", "DockerBackend"]


class DockerBackend(ResumableBackend[DockerOptions, DockerPlan]):
    """Run the task in a Docker container with the requested GPUs, CPUs, memory and ``/dev/shm``."""

    name = "docker"
    state_key = durable.KEY

    def __init__(self, options: DockerOptions, log: Any = None) -> None:
        super().__init__(options, log)
        self._client: Any = None
        self._container_id: str | None = None  # the container being started or followed (``kill`` stops it)
        self._killed = False
        self._stop_timeout = 30.0  # the running plan's
        self._state_dir: str | None = None  # the running plan's (where a lasting container's files lie)
        self._store: Any = None  # the task instance's task state store (Airflow >= 3.3)
        self._deadline: float | None = None  # when a deferred container times out
        self._started: launch.Started | None = None  # the container this try started, until it is followed
        self._engine: EngineFacts | None = None  # what the engine said of itself (rootless, Podman, its limits)

    def plan(self, request: TaskRequest, conf: GpuConfig) -> DockerPlan:
        """Translate the request into container arguments (:func:`.plan.plan_container`).

        What a task does not name comes from its engine's connection (:func:`.client.read_engine`): the registry,
        the CA bundle of builds, the parent image, the size of ``/dev/shm``.
        """
        return plan_container(request, self.options, conf, read_engine(self.options.docker_conn_id))

    def _open(self, plan: DockerPlan, context: Context) -> Any:
        """The engine's client, once per try: the checkpoint folder made, a dead worker's containers reaped first."""
        self._state_dir = plan.host.state_dir
        if self._client is None:
            checkpoint_folder(plan)
            self._client = connect(self.options)
            self._engine = engine_facts(self._client, str(self.options.engine_url))
            self.log.info("Docker engine %s: %s", self.options.engine_url, self._engine.describe())
            self._store = context.get("task_state_store")
            reap_orphans(self._client, plan.host.state_dir, self.log)  # before any GPU is taken: a dead worker's
            # container may hold it
        return self._client

    # ------------------------------------------------------------------ the synchronous run (durable)
    def submit(self, plan: DockerPlan, context: Context) -> dict[str, Any]:
        """Start the container (an earlier try's that is not taken over is removed first); its record."""
        client = self._open(plan, context)
        self._remove_earlier(client, plan)
        started = self._launch(client, plan, defer=False)
        assert isinstance(started, launch.Started)  # without defer, never a Deferral
        return started.record

    def job_status(self, plan: DockerPlan, record: Any, context: Context) -> str:
        """The recorded container's state (``running``, ``exited 0``, ...), ``missing`` when it is not this task's."""
        client = self._open(plan, context)
        container_id = durable.recorded_id(record, str(plan.options.engine_url))
        return durable.status(None if container_id is None else durable.find(client, container_id, plan.request.labels))

    def job_active(self, status: str) -> bool:
        """The container runs: a later try follows it."""
        return durable.is_active(status)

    def job_succeeded(self, status: str) -> bool:
        """The container ended with status 0: a later try collects its result."""
        return durable.is_succeeded(status)

    def follow(self, plan: DockerPlan, record: Any, context: Context) -> TaskResult:
        """Log the container's output to its end, read its result, remove it (unless a later try took it over)."""
        client = self._open(plan, context)
        started, self._started = self._started, None
        if started is None or started.record != record:  # an earlier try's container: this try's from now on
            return self._follow(client, plan, str(record["id"]), self._take_over(client, plan, str(record["id"])))
        with started.held:  # the GPUs (and the watch for GPU faults) of the container this try started
            return self._follow(client, plan, started.container_id, started.mem_limit, started.stream, own=started)

    # ------------------------------------------------------------------ deferred
    def start(self, plan: DockerPlan, context: Context) -> TaskResult | Deferral:
        """As :meth:`submit`, up to the container's start; then the task defers to the container's trigger.

        A container an earlier try left is taken over as the synchronous run takes it: followed while it runs (the
        trigger watches it), collected when it ended well, else removed.
        """
        timeout = context["task"].execution_timeout
        self._deadline = None if timeout is None else time.time() + timeout.total_seconds()
        client = self._open(plan, context)
        earlier = self._earlier(client, plan) if plan.request.durable else None
        if earlier is not None and durable.is_active(earlier[1]):
            return self._deferral(plan, earlier[0], self._take_over(client, plan, earlier[0]))
        if earlier is not None and durable.is_succeeded(earlier[1]):
            return self.follow(plan, durable.RECORD.entry(earlier[0], str(plan.options.engine_url), ""), context)
        self._remove_earlier(client, plan)
        started = self._launch(client, plan, defer=True)
        return started if isinstance(started, Deferral) else self.follow(plan, started.record, context)

    def resume(self, plan: DockerPlan, state: dict[str, Any], event: Any, context: Context) -> TaskResult:
        """After the trigger fired: log the container's output, read its result, remove it."""
        client = self._client = connect(self.options)
        self._store = context.get("task_state_store")
        container_id, status = str(state["container_id"]), (event or {}).get("status")
        if status == "refused":
            raise GpuTaskError(f"Container {container_id[:12]} is not this task's: its trigger watched nothing.")
        if status == "missing":
            durable.RECORD.forget(self._store)
            raise GpuTaskError(
                f"Container {container_id[:12]} was removed while the task was deferred (by hand, or by another "
                "tool): its output and result are lost."
            )
        if status == "timeout":
            self.log.warning("The task timed out while deferred: stopping container %s", container_id[:12])
            client.stop(container_id, timeout=round(plan.stop_timeout))
        rest = lifecycle.rest_of_output(client, container_id, (event or {}).get("output") or {}, self.log)
        return self._follow(client, plan, container_id, state.get("mem_limit"), rest, timed_out=status == "timeout")

    def _deferral(self, plan: DockerPlan, container_id: str, mem_limit: int | None) -> Deferral:
        """The trigger that waits for the container, reaching the engine as this worker did."""
        from airflow_gpu_provider.backends.docker.trigger import ENGINE_OPTIONS, DockerContainerTrigger

        url = plan.options.engine_url
        engine = {name: getattr(plan.options, name) for name in ENGINE_OPTIONS}
        engine["docker_url"] = url if isinstance(url, str) else list(url)
        self.log.info("Deferred: the triggerer watches container %s (engine %s)", container_id[:12], url)
        state = {"container_id": container_id, "mem_limit": mem_limit}
        trigger = DockerContainerTrigger(
            container_id, engine, plan.poll_interval, self._deadline, state=state, stop_timeout=plan.stop_timeout
        )
        return Deferral(trigger, state)

    # ------------------------------------------------------------------ one container
    def _launch(self, client: Any, plan: DockerPlan, *, defer: bool) -> launch.Started | Deferral:
        """Image, GPUs, create, start (:func:`.launch.launch`); the container, or the deferral that watches it."""
        self._killed, self._stop_timeout = False, plan.stop_timeout
        plan = plan.on(self._engine) if self._engine is not None else plan
        lasting = defer or (plan.request.durable and self._store is not None)  # it may outlive this process
        started = launch.launch(
            client, plan, self._store, self.log, lasting=lasting, attach=not defer, created=self._created
        )
        if defer and (started.keeper is not None or not started.locks):
            self._container_id = None
            try:
                with started.held:  # the keeper holds the GPU locks from now on
                    return self._deferral(plan, started.container_id, started.mem_limit)
            except BaseException:  # (the task's execution_timeout, say): the container is not handed over
                self._release(client, plan, started.container_id, started, succeeded=False)
                raise
        if defer:
            self.log.warning("Not deferred: no keeper holds the GPU locks, so this worker holds them itself.")
        self._started = started
        return started

    def _created(self, container_id: str | None) -> None:
        """The container being started (``None``: none), which :meth:`kill` stops."""
        self._container_id = container_id

    def _earlier(self, client: Any, plan: DockerPlan) -> tuple[str, str] | None:
        """The container an earlier try of this task instance recorded on this engine, and its status; or ``None``."""
        container_id = durable.recorded(self._store, str(plan.options.engine_url))
        found = None if container_id is None else durable.find(client, container_id, plan.request.labels)
        return None if container_id is None or found is None else (container_id, durable.status(found))

    def _remove_earlier(self, client: Any, plan: DockerPlan) -> None:
        """Remove the container an earlier try of this task instance recorded, which no try takes over; forget it."""
        earlier = self._earlier(client, plan)
        if earlier is None:
            return
        container_id, status = earlier
        why = "durable=False" if not plan.request.durable else f"it is {status}: the task starts afresh"
        self.log.warning("Removing container %s left by an earlier try of this task (%s)", container_id[:12], why)
        lifecycle.stop(client, container_id, plan.stop_timeout, plan.host.state_dir)
        durable.RECORD.forget(self._store)

    def _take_over(self, client: Any, plan: DockerPlan, container_id: str) -> int | None:
        """An earlier try's container is this try's from now on (its record names this try); its memory limit."""
        found = client.inspect_container(container_id)
        ended = found["State"].get("Status") in ("exited", "dead")
        self.log.info(
            "Reattached to container %s, %s by an earlier try of this task instance (durable=True): its output follows",
            container_id[:12],
            "ended" if ended else "left running",
        )
        durable.RECORD.record(self._store, container_id, str(plan.options.engine_url), plan.try_number)
        return found.get("HostConfig", {}).get("Memory") or None

    def _follow(
        self,
        client: Any,
        plan: DockerPlan,
        container_id: str,
        mem_limit: int | None,
        stream: Any = None,
        *,
        own: launch.Started | None = None,
        timed_out: bool = False,
    ) -> TaskResult:
        """Log a container's output (``stream``, else all of it from the engine), read its result, remove it.

        :param own: the container is this try's own start (its files, its keeper: ended with it)
        """
        # _killed is not reset here: an on_kill that came while the container was being created or started (it
        # removed the container, so its output ends with 137) must still be told as the kill it was
        self._container_id, self._stop_timeout = container_id, plan.stop_timeout
        succeeded = False
        try:
            attached = own is not None and stream is not None and stream is own.stream
            outcome = self._collect(client, container_id, mem_limit, stream, attached=attached, timed_out=timed_out)
            succeeded = True
            return outcome
        finally:
            self._container_id = None
            self._release(client, plan, container_id, own, succeeded=succeeded)

    def _release(
        self, client: Any, plan: DockerPlan, container_id: str, own: launch.Started | None, *, succeeded: bool
    ) -> None:
        """Remove a container and forget it, unless a later try took it over (:meth:`.JobRecord.owns`)."""
        lasting = own is None or own.lasting
        if not lasting or durable.RECORD.owns(self._store, container_id, plan.try_number, self.log):
            lifecycle.cleanup(client, container_id, plan, self.log, started=True, succeeded=succeeded)
            if lasting:
                durable.RECORD.forget(self._store)
            if own is not None and own.keeper is not None:
                own.keeper.stop()  # (a container taken over keeps its keeper: it ends with the container)

    def _collect(
        self,
        client: Any,
        container_id: str,
        mem_limit: int | None,
        stream: Any,
        *,
        attached: bool = False,
        timed_out: bool = False,
    ) -> TaskResult:
        """Log the container's output (``stream``, or all of it from the engine) to its end; read its result.

        :param attached: ``stream`` is the output this try attached to before the start: its result line is the one
        """
        results = lifecycle.log_lines(lifecycle.output(client, container_id) if stream is None else stream, self.log)
        if timed_out:
            from airflow.providers.common.compat.sdk import AirflowTaskTimeout  # airflow.sdk.exceptions from 3.2

            raise AirflowTaskTimeout(f"Timeout: container {container_id[:12]} outlived the task's execution_timeout")
        if self._killed:
            raise GpuTaskError(f"Container {container_id[:12]} was stopped because the task was killed.")
        return lifecycle.collect(client, container_id, mem_limit, results if attached else None)  # else the engine's

    def kill(self) -> None:
        """Called from ``on_kill``: stop the container (SIGTERM, then SIGKILL after ``stop_timeout``), remove it."""
        container_id, client = self._container_id, self._client
        if container_id is None or client is None:
            return
        self._killed = True
        self.log.info("Stopping container %s", container_id[:12])
        lifecycle.stop(client, container_id, self._stop_timeout, self._state_dir)
