"""The Docker backend: the task runs in a container on a Docker engine, reached through ``DockerHook``.

``plan()`` maps the request to container arguments (pure, :mod:`.plan`); ``run()`` finds or builds the image
(:mod:`.images`), takes the GPUs from the host allocator when the engine is on this host, creates the container
with the runtime and the envelope in ``/airflow-gpu`` (:mod:`.files`), starts it, streams its output to the task
log, reads the result back and removes the container on every path (:mod:`.lifecycle`). ``start()`` does the same
up to the start and defers to :class:`.trigger.DockerContainerTrigger`; ``resume()`` collects. A container an
earlier try of the task instance left is taken over instead of started again (:mod:`.durable`).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from airflow_gpu_provider.backends.base import Backend, Deferral
from airflow_gpu_provider.backends.docker import durable, lifecycle
from airflow_gpu_provider.backends.docker.client import connect
from airflow_gpu_provider.backends.docker.files import TaskFiles, checkpoint_folder
from airflow_gpu_provider.backends.docker.images.task_image import task_image
from airflow_gpu_provider.backends.docker.lifecycle import ContainerOomError, NoGpuRuntime
from airflow_gpu_provider.backends.docker.options import DockerOptions
from airflow_gpu_provider.backends.docker.orphans import reap_orphans
from airflow_gpu_provider.backends.docker.plan import CONTAINER_DIR, DockerPlan, plan_container
from airflow_gpu_provider.exceptions import GpuTaskError, GpuUnavailableError
from airflow_gpu_provider.host.allocator import Allocation
from airflow_gpu_provider.host.keeper import Keeper
from airflow_gpu_provider.host.quarantine import on_fault
from airflow_gpu_provider.task.request import TaskRequest
from airflow_gpu_provider.task.result import TaskResult
from airflow_gpu_provider.task.runtime_zip import FILE_NAME, compiled

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_gpu_provider.config.worker import GpuConfig

__all__ = ["ContainerOomError", "DockerBackend"]

TOOLKIT_FIX = (
    "Install the NVIDIA Container Toolkit on the Docker host and register it with Docker "
    "(nvidia-ctk runtime configure --runtime=docker, then restart dockerd)"
)


class DockerBackend(Backend[DockerOptions, DockerPlan]):
    """Run the task in a Docker container with the requested GPUs, CPUs, memory and ``/dev/shm``."""

    name = "docker"

    def __init__(self, options: DockerOptions, log: Any = None) -> None:
        super().__init__(options, log)
        self._client: Any = None
        self._container_id: str | None = None
        self._killed = False
        self._locks: list[int] = []  # the descriptors of this task's GPU locks
        self._stop_timeout = 30.0  # the running plan's
        self._store: Any = None  # the task instance's task state store (Airflow >= 3.3)
        self._deadline: float | None = None  # when a deferred container times out

    def plan(self, request: TaskRequest, conf: GpuConfig) -> DockerPlan:
        """Translate the request into container arguments (:func:`.plan.plan_container`)."""
        return plan_container(request, self.options, conf)

    # ------------------------------------------------------------------ run
    def run(self, plan: DockerPlan, context: Context) -> TaskResult:
        """Find or build the image, run the container to completion, return its result; remove it on every path."""
        outcome = self._go(plan, context, defer=False)
        assert isinstance(outcome, TaskResult)  # without defer, never a Deferral
        return outcome

    def start(self, plan: DockerPlan, context: Context) -> TaskResult | Deferral:
        """As :meth:`run`, up to the container's start; then the task defers to the container's trigger."""
        timeout = context["task"].execution_timeout
        self._deadline = None if timeout is None else time.time() + timeout.total_seconds()
        return self._go(plan, context, defer=True)

    def resume(self, plan: DockerPlan, state: dict[str, Any], event: Any, context: Context) -> TaskResult:
        """After the trigger fired: log the container's output, read its result, remove it."""
        client = self._client = connect(self.options)
        self._store = context.get("task_state_store")
        container_id, status = str(state["container_id"]), (event or {}).get("status")
        if status == "missing":
            durable.forget(self._store)
            raise GpuTaskError(
                f"Container {container_id[:12]} was removed while the task was deferred (by hand, or by another "
                "tool): its output and result are lost."
            )
        if status == "timeout":
            self.log.warning("The task timed out while deferred: stopping container %s", container_id[:12])
            client.stop(container_id, timeout=round(plan.stop_timeout))
        rest = lifecycle.rest_of_output(client, container_id, (event or {}).get("output") or {}, self.log)
        return self._follow(client, plan, container_id, state.get("mem_limit"), rest, timed_out=status == "timeout")

    def _go(self, plan: DockerPlan, context: Context, *, defer: bool) -> TaskResult | Deferral:
        checkpoint_folder(plan)
        client = self._client = connect(self.options)
        self._store = context.get("task_state_store")
        reap_orphans(client, self.log)  # before any GPU is taken: a dead worker's container may still hold it
        earlier = self._earlier_container(client, plan)
        if earlier is not None:
            return self._reattach(client, plan, earlier, defer=defer)
        for note in (*plan.notes, *plan.resources.notes):
            self.log.warning("%s", note)
        with (
            task_image(client, plan, self.log) as image,  # a derived image stays until its container exists
            self._host_gpus(plan) as allocation,
            on_fault(plan.host, allocation.devices, self.log, positional=True),
        ):
            self._locks = allocation.fds  # an Xid or ECC error: its GPUs (0, 1, ... in the container) are quarantined
            if allocation.cpu_fallback:
                return self._run_container(client, plan, image, cpu_fallback=allocation.reason, defer=defer)
            if allocation.devices:
                ids = [device.id for device in allocation.devices]
                self.log.info("GPUs %s from the host allocator (shared with the local backend's tasks)", ids)
                plan = plan.on_devices(ids)
            return self._run_gpu_container(client, plan, image, defer=defer)

    def _host_gpus(self, plan: DockerPlan) -> Allocation:
        """Devices from the host GPU allocator (which a task's ``devices`` only narrow) on a host whose GPUs are known.

        Otherwise (a remote engine, or GPUs neither NVML nor ``[gpu] devices`` knows) Docker hands out GPUs by count.
        """
        resources = plan.request.resources
        if not resources.requests_gpus or not plan.options.engine_is_local:
            return Allocation(devices=[])
        present = plan.host.present(resources.gpu_vendor)
        if not present:
            return Allocation(devices=[])
        return plan.host.allocate(plan.request, backend=self.name, log=self.log, present=present)

    def _run_gpu_container(self, client: Any, plan: DockerPlan, image: str, *, defer: bool) -> TaskResult | Deferral:
        """Run with the GPU request; without an NVIDIA runtime, fail naming the fix or fall back to CPU."""
        try:
            return self._run_container(client, plan, image, cpu_fallback=None, defer=defer)
        except NoGpuRuntime as err:
            requested = plan.request.resources.describe().split(",")[0]
            policy = plan.request.missing_gpu
            if not policy.runs_on_cpu:
                hint = " Waiting cannot help." if policy.waits else ""
                raise GpuUnavailableError(
                    f"Requested {requested}, but the Docker engine cannot start GPU containers: {err}. "
                    f"{TOOLKIT_FIX}; or set on_missing_gpu='cpu' to run on CPU instead.{hint}"
                ) from None
            self.log.warning(
                "Requested %s, but the Docker engine cannot start GPU containers (%s). on_missing_gpu='cpu': "
                "running on CPU instead. To use the GPUs: %s.",
                requested,
                err,
                TOOLKIT_FIX,
            )
            reason = f"the Docker engine cannot start GPU containers ({err})"
            return self._run_container(client, plan, image, cpu_fallback=reason, defer=defer)

    def _run_container(
        self, client: Any, plan: DockerPlan, image: str, *, cpu_fallback: str | None, defer: bool
    ) -> TaskResult | Deferral:
        """Create and start the container; follow it to its end, or hand it to a trigger (``defer``).

        :param cpu_fallback: why it runs on the CPU instead of its GPUs (``on_missing_gpu="cpu"``), or ``None``
        """
        files = self._files(plan, image, cpu_fallback)
        lasting = defer or (plan.request.reattach and self._store is not None)  # may outlive this process
        with TaskFiles(files, parent=f"{plan.host.state_dir}/docker-tasks") as task_files:
            kwargs = plan.create_kwargs(image, cpu_fallback=cpu_fallback is not None)
            mem_limit = kwargs["host_config"].get("mem_limit")
            container_id = lifecycle.create(client, kwargs, task_files, plan, self.log, durable=lasting)
            self._container_id, self._killed, self._stop_timeout = container_id, False, plan.stop_timeout
            started = succeeded = handed_over = False
            keeper: Keeper | None = None
            try:
                task_files.copy_in(client, container_id)
                if lasting:
                    durable.record(self._store, container_id, str(plan.options.engine_url), plan.try_number)
                stream = (
                    None if defer else client.attach(container_id, stdout=True, stderr=True, stream=True, demux=True)
                )
                lifecycle.start(client, container_id, image)
                started = True
                keeper = lifecycle.keep_locks(client, container_id, self._locks, self.log)
                self.log.info("Started container %s from %s", container_id[:12], image)
                if defer and (keeper is not None or not self._locks):
                    handed_over = True
                    return self._deferral(plan, container_id, mem_limit)
                if defer:
                    self.log.warning("Not deferred: no keeper holds the GPU locks, so this worker holds them itself.")
                outcome = self._collect(client, container_id, mem_limit, stream)
                succeeded = True
                return outcome
            finally:
                self._container_id = None
                if not handed_over and (not lasting or self._owns(plan, container_id)):
                    lifecycle.cleanup(client, container_id, plan, self.log, started=started, succeeded=succeeded)
                    if lasting:
                        durable.forget(self._store)
                    if keeper is not None:
                        keeper.stop()  # (a container taken over keeps its keeper: it ends with the container)

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

    def _earlier_container(self, client: Any, plan: DockerPlan) -> dict[str, Any] | None:
        """The container an earlier try of this task instance left on this engine, to take over; else ``None``.

        With ``reattach=False`` (or one that never started) it is removed, and the task starts afresh.
        """
        container_id = durable.recorded(self._store, str(plan.options.engine_url))
        found = None if container_id is None else durable.find(client, container_id, plan.request.labels)
        if container_id is None or found is None:
            return None
        if plan.request.reattach and found["State"].get("Status") != "created":
            return found
        self.log.warning(
            "Removing container %s left by an earlier try of this task (reattach=False)", container_id[:12]
        )
        lifecycle.stop(client, container_id, plan.stop_timeout)
        durable.forget(self._store)
        return None

    def _reattach(self, client: Any, plan: DockerPlan, found: dict[str, Any], *, defer: bool) -> TaskResult | Deferral:
        """Take over the container of an earlier try: defer to it, or follow it and collect its result."""
        container_id, state = str(found["Id"]), found["State"]
        mem_limit = found.get("HostConfig", {}).get("Memory") or None
        ended = state.get("Status") in ("exited", "dead")
        self.log.info(
            "Reattached to container %s, %s by an earlier try of this task instance (reattach=True): its output "
            "follows",
            container_id[:12],
            "ended" if ended else "left running",
        )
        durable.record(self._store, container_id, str(plan.options.engine_url), plan.try_number)  # this try's now
        if defer and not ended:
            return self._deferral(plan, container_id, mem_limit)
        return self._follow(client, plan, container_id, mem_limit)

    def _owns(self, plan: DockerPlan, container_id: str) -> bool:
        """No later try took the container over: this try may remove it (``durable.owns``)."""
        return durable.owns(self._store, container_id, plan.try_number, self.log)

    def _follow(
        self, client: Any, plan: DockerPlan, container_id: str, mem_limit: int | None, rest: Any = None, **how: bool
    ) -> TaskResult:
        """Log a container's output (the ``rest`` of it, else all), read its result, remove it (not this try's)."""
        self._container_id, self._killed, self._stop_timeout = container_id, False, plan.stop_timeout
        succeeded = False
        try:
            outcome = self._collect(client, container_id, mem_limit, rest, **how)
            succeeded = True
            return outcome
        finally:
            self._container_id = None
            if self._owns(plan, container_id):
                lifecycle.cleanup(client, container_id, plan, self.log, started=True, succeeded=succeeded)
                durable.forget(self._store)

    def _collect(
        self, client: Any, container_id: str, mem_limit: int | None, stream: Any, *, timed_out: bool = False
    ) -> TaskResult:
        """Log the container's output (``stream``, or all of it from the engine) to its end; read its result."""
        lifecycle.log_lines(stream if stream is not None else lifecycle.output(client, container_id), self.log)
        if timed_out:
            from airflow.providers.common.compat.sdk import AirflowTaskTimeout  # airflow.sdk.exceptions from 3.2

            raise AirflowTaskTimeout(f"Timeout: container {container_id[:12]} outlived the task's execution_timeout")
        if self._killed:
            raise GpuTaskError(f"Container {container_id[:12]} was stopped because the task was killed.")
        return lifecycle.collect(client, container_id, mem_limit)

    def _files(self, plan: DockerPlan, image: str, cpu_fallback: str | None) -> dict[str, bytes]:
        """The runtime (precompiled by the worker's Python) and the envelope (with the summary it prints first)."""
        # gpus None: the runtime asks nvidia-smi in the container (a CPU task gets NVIDIA_VISIBLE_DEVICES=void)
        envelope = plan.request.runtime_envelope(
            backend=self.name,
            image=image,
            gpus=None,
            cpu_fallback=cpu_fallback is not None,
            fallback_reason=cpu_fallback or "",
        )
        return {FILE_NAME: compiled(f"{CONTAINER_DIR}/{FILE_NAME}"), "envelope.json": json.dumps(envelope).encode()}

    def kill(self) -> None:
        """Called from ``on_kill``: stop the container (SIGTERM, then SIGKILL after ``stop_timeout``), remove it."""
        container_id, client = self._container_id, self._client
        if container_id is None or client is None:
            return
        self._killed = True
        self.log.info("Stopping container %s", container_id[:12])
        lifecycle.stop(client, container_id, self._stop_timeout)
