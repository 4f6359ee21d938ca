"""The Docker backend: the task runs in a container on a Docker engine, reached through ``DockerHook``.

``plan()`` maps the request to container arguments (pure, :mod:`.plan`); ``run()`` finds or builds the image
(:mod:`.images`), takes the GPUs from the host allocator when the engine is on this host, creates the container
with the runtime and the envelope in ``/airflow-gpu`` (:mod:`.files`), starts it, streams its output to the task
log, reads the result back and removes the container on every path.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from docker.errors import APIError

from airflow_gpu_provider.backends.base import Backend
from airflow_gpu_provider.backends.docker.client import connect
from airflow_gpu_provider.backends.docker.files import TaskFiles, checkpoint_folder, read_result
from airflow_gpu_provider.backends.docker.images.catalogue import cpu_only_reason
from airflow_gpu_provider.backends.docker.images.dockerfile import derived_image_spec, worker_uv
from airflow_gpu_provider.backends.docker.images.engine import ensure_derived_image, resolve_image
from airflow_gpu_provider.backends.docker.options import DockerOptions
from airflow_gpu_provider.backends.docker.orphans import AUTO_REMOVE_LABEL, WORKER_LABEL, reap_orphans
from airflow_gpu_provider.backends.docker.plan import DockerPlan, plan_container
from airflow_gpu_provider.exceptions import OOM_REMEDY, GpuTaskError, GpuUnavailableError, HostOutOfMemoryError
from airflow_gpu_provider.host.allocator import Allocation
from airflow_gpu_provider.host.keeper import Keeper
from airflow_gpu_provider.host.workers import worker_identity
from airflow_gpu_provider.policy import Policy
from airflow_gpu_provider.policy.docker import check_container
from airflow_gpu_provider.settings.units import format_bytes
from airflow_gpu_provider.task.output import LineSplitter
from airflow_gpu_provider.task.request import TaskRequest
from airflow_gpu_provider.task.result import TaskResult, task_result
from airflow_gpu_provider.task.runtime_zip import FILE_NAME, archive

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_gpu_provider.config.worker import GpuConfig

NO_GPU_RUNTIME = "could not select device driver"
TOOLKIT_FIX = (
    "Install the NVIDIA Container Toolkit on the Docker host and register it with Docker "
    "(nvidia-ctk runtime configure --runtime=docker, then restart dockerd)"
)


class ContainerOomError(HostOutOfMemoryError):
    """The container was killed because it ran out of memory (its memory limit): an ``on_oom`` memory step."""


class _NoGpuRuntime(Exception):
    """The engine cannot start GPU containers (no NVIDIA runtime)."""


def _log_lines(stream: Iterable[tuple[bytes | None, bytes | None]], log: logging.Logger) -> None:
    """Log a container's output line by line as it comes (:mod:`~airflow_gpu_provider.task.output`).

    stdout and stderr are split apart, so a line an unbuffered ``print`` writes in two pieces is never cut by the other.
    """
    splitters = (LineSplitter(), LineSplitter())
    for frames in stream:
        for splitter, data in zip(splitters, frames, strict=False):
            for line in splitter.feed(data or b""):
                log.info("%s", line)
    for splitter in splitters:
        for line in splitter.flush():
            log.info("%s", line)


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

    def plan(self, request: TaskRequest, conf: GpuConfig) -> DockerPlan:
        """Translate the request into container arguments (:func:`.plan.plan_container`)."""
        return plan_container(request, self.options, conf)

    # ------------------------------------------------------------------ run
    def run(self, plan: DockerPlan, context: Context) -> TaskResult:
        """Find or build the image, run the container to completion, return its result; remove it on every path."""
        checkpoint_folder(plan)
        client = self._client = connect(self.options)
        reap_orphans(client, self.log)  # before any GPU is taken: a dead worker's container may still hold it
        for note in (*plan.notes, *plan.resources.notes):
            self.log.warning("%s", note)
        image = self._image(client, plan)
        with self._host_gpus(plan) as allocation:
            self._locks = allocation.fds
            if allocation.cpu_fallback:
                return self._run_container(client, plan, image, cpu_fallback=True)
            if allocation.devices:
                ids = [device.id for device in allocation.devices]
                self.log.info("GPUs %s from the host allocator (shared with the local backend's tasks)", ids)
                plan = plan.on_devices(ids)
            return self._run_gpu_container(client, plan, image)

    def _host_gpus(self, plan: DockerPlan) -> Allocation:
        """Devices from the host GPU allocator when the engine is on this host and its GPUs are known.

        Otherwise (a remote engine, explicit ``devices``, or a host whose GPUs NVML and ``[gpu] devices`` do not
        know) Docker hands out GPUs by count, and nothing stops two tasks from sharing one.
        """
        resources = plan.request.resources
        if not resources.requests_gpus or plan.options.devices or not plan.options.engine_is_local:
            return Allocation(devices=[])
        present = plan.host.present(resources.gpu_vendor)
        if not present:
            return Allocation(devices=[])
        return plan.host.allocate(plan.request, backend=self.name, log=self.log, present=present)

    def _run_gpu_container(self, client: Any, plan: DockerPlan, image: str) -> TaskResult:
        """Run with the GPU request; without an NVIDIA runtime, fail naming the fix or fall back to CPU."""
        try:
            return self._run_container(client, plan, image, cpu_fallback=False)
        except _NoGpuRuntime as err:
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
            return self._run_container(client, plan, image, cpu_fallback=True)

    def _image(self, client: Any, plan: DockerPlan) -> str:
        """The image to run: the parent image, or its derived image with the requirements installed."""
        parent = resolve_image(client, plan.parent_image, plan.options.pull, self.log)
        image = plan.parent_image
        if plan.request.image.requirements:
            uv = worker_uv(plan.request.image, plan.build, parent.get("Architecture"), self.log)
            spec = derived_image_spec(plan.parent_image, plan.request.image, plan.build, uv_binary=uv)
            image, _ = ensure_derived_image(
                client,
                spec,
                parent["Id"],
                lock_dir=f"{plan.host.state_dir}/docker-builds",
                push=plan.build.registry is not None,
                log=self.log,
            )
        if plan.resources.host_config.get("device_requests"):  # an NVIDIA GPU task: is the image a CUDA one?
            config_ = parent.get("Config") or {}
            reason = cpu_only_reason(plan.parent_image, config_.get("Env") or (), config_.get("Labels") or {})
            if reason:
                self.log.warning(
                    "GPUs were requested but the image %s looks CPU-only (%s): code inside may not see the GPUs. "
                    "Use a CUDA image such as %s (see airflow_gpu_provider.backends.docker.images.catalogue).",
                    plan.parent_image,
                    reason,
                    plan.cuda_image,
                )
        return image

    def _run_container(self, client: Any, plan: DockerPlan, image: str, *, cpu_fallback: bool) -> TaskResult:
        files = self._files(plan, image, cpu_fallback)
        with TaskFiles(files, parent=f"{plan.host.state_dir}/docker-tasks") as task_files:
            kwargs = plan.create_kwargs(image, cpu_fallback=cpu_fallback)
            container_id = self._create(client, kwargs, task_files, plan)
            self._container_id, self._killed, self._stop_timeout = container_id, False, plan.stop_timeout
            started = succeeded = False
            keeper: Keeper | None = None
            try:
                task_files.copy_in(client, container_id)
                stream = client.attach(container_id, stdout=True, stderr=True, stream=True, demux=True)
                try:
                    client.start(container_id)
                except APIError as err:
                    if NO_GPU_RUNTIME in str(err.explanation):
                        raise _NoGpuRuntime(err.explanation) from None
                    missing = "executable file not found" in str(err.explanation)  # the image has no python3
                    hint = " The image needs python3 on its PATH." if missing else ""
                    raise GpuTaskError(
                        f"Docker could not start the task container from {image}: {err.explanation}.{hint}"
                    ) from None
                started = True
                keeper = self._keep_locks(client, container_id)
                self.log.info("Started container %s from %s", container_id[:12], image)
                _log_lines(stream, self.log)
                if self._killed:
                    raise GpuTaskError(f"Container {container_id[:12]} was stopped because the task was killed.")
                exit_code = int(client.wait(container_id)["StatusCode"])
                if exit_code != 0 and client.inspect_container(container_id)["State"].get("OOMKilled"):
                    limit = kwargs["host_config"].get("mem_limit")
                    raise ContainerOomError(
                        f"Container {container_id[:12]} was killed because it ran out of memory (OOM, exit status "
                        f"{exit_code}; memory limit {format_bytes(limit) if limit else 'none'}). "
                        + OOM_REMEDY[ContainerOomError.kind]
                    )
                result = read_result(client, container_id)
                outcome = task_result(result, exit_code, where=f"container {container_id[:12]}")
                succeeded = True
                return outcome
            finally:
                self._container_id = None
                self._cleanup(client, container_id, plan, started=started, succeeded=succeeded)
                if keeper is not None:
                    keeper.stop()

    def _keep_locks(self, client: Any, container_id: str) -> Keeper | None:
        """The GPU locks live as long as the container, even if this worker is killed (host/keeper.py)."""
        if not self._locks:
            return None
        try:
            return Keeper(
                client.inspect_container(container_id)["State"]["Pid"], self._locks, container_id=container_id
            )
        except (OSError, ValueError) as err:
            self.log.warning("The GPU locks are held by this worker alone (%s): if it dies, so do they.", err)
            return None

    def _create(self, client: Any, kwargs: dict[str, Any], files: TaskFiles, plan: DockerPlan) -> str:
        """Create the container with the worker folder mounted, or without it where the engine cannot see it."""
        files.mounted = plan.options.mount_tmp_dir
        while True:
            create, host_config = self.final_call(kwargs, files, plan)
            try:
                config_ = client.create_host_config(**{**host_config, "mounts": host_config["mounts"] or None})
                return str(client.create_container(host_config=config_, **create)["Id"])
            except APIError as err:
                if files.mounted and str(files.path) in str(err.explanation):
                    self.log.warning(
                        "The Docker engine cannot see the worker's folder %s (a remote engine?); the task's files "
                        "are copied through the Docker API instead. backend_options mount_tmp_dir=False skips this "
                        "attempt.",
                        files.path,
                    )
                    files.mounted = False
                    continue
                raise GpuTaskError(
                    f"Docker could not create the task container from {kwargs['image']}: {err.explanation}"
                ) from None

    @staticmethod
    def final_call(kwargs: dict[str, Any], files: TaskFiles, plan: DockerPlan) -> tuple[dict[str, Any], dict[str, Any]]:
        """The whole create call, after every merge: ``(create_container arguments, host config arguments)``.

        Checked against the worker's ``[gpu]`` policy (:func:`~airflow_gpu_provider.policy.docker.check_container`)
        before it is returned: nothing reaches the engine that the policy refuses.
        """
        labels = {WORKER_LABEL: worker_identity(), AUTO_REMOVE_LABEL: plan.options.auto_remove}
        create = {**kwargs, "labels": {**kwargs["labels"], **labels}}
        host_config = create.pop("host_config")
        mounts = [*host_config.get("mounts", []), *([files.mount] if files.mounted else [])]
        host_config = {**host_config, "mounts": mounts}
        location = plan.request.checkpoint
        own = [str(files.path), *([] if location is None or location.is_uri else [location.path])]
        check_container(create, host_config, plan.policy or Policy.current(), provider_sources=own)
        return create, host_config

    def _files(self, plan: DockerPlan, image: str, cpu_fallback: bool) -> dict[str, bytes]:
        """The runtime and the envelope (with the resource summary the runtime prints first)."""
        # gpus None: the runtime asks nvidia-smi in the container (a CPU task gets NVIDIA_VISIBLE_DEVICES=void)
        envelope = plan.request.runtime_envelope(backend=self.name, image=image, gpus=None, cpu_fallback=cpu_fallback)
        return {FILE_NAME: archive(), "envelope.json": json.dumps(envelope).encode()}

    def _cleanup(self, client: Any, container_id: str, plan: DockerPlan, *, started: bool, succeeded: bool) -> None:
        """Remove the container (``auto_remove``); a kept or running one (a timeout) is stopped first. Never raises.

        Stopped: SIGTERM, then SIGKILL after the grace period (time for a last checkpoint).
        """
        auto_remove = plan.options.auto_remove
        keep = started and (auto_remove == "never" or (auto_remove == "success" and not succeeded))
        try:
            if keep or (started and not succeeded):
                client.stop(container_id, timeout=round(plan.stop_timeout))
            if keep:
                self.log.info("Kept container %s for inspection (auto_remove=%r)", container_id[:12], auto_remove)
            else:
                client.remove_container(container_id, force=True)
        except APIError as err:
            if getattr(err, "status_code", None) != 404:
                self.log.warning("Could not clean up container %s: %s", container_id[:12], err)

    def kill(self) -> None:
        """Called from ``on_kill``: stop the container (SIGTERM, then SIGKILL after ``stop_timeout``), remove it."""
        container_id, client = self._container_id, self._client
        if container_id is None or client is None:
            return
        self._killed = True
        self.log.info("Stopping container %s", container_id[:12])
        with contextlib.suppress(APIError):
            client.stop(container_id, timeout=round(self._stop_timeout))
        with contextlib.suppress(APIError):
            client.remove_container(container_id, force=True)
