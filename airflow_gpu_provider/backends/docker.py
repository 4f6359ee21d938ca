"""The Docker backend: the task runs in a container on a Docker engine, reached through ``DockerHook``.

``plan()`` maps the request to container and host-config arguments (pure, see :mod:`.docker_resources`);
``run()`` finds or builds the image (:mod:`airflow_gpu_provider.images`), creates the container with the runtime
and the envelope in ``/airflow-gpu`` (:mod:`.docker_files`), starts it, streams its output to the task log, reads
the result back and removes the container on every path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import platform
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_gpu_provider import config
from airflow_gpu_provider.backends.base import Backend, TaskRequest, TaskResult, result_value
from airflow_gpu_provider.backends.docker_files import COMMAND, TaskFiles
from airflow_gpu_provider.backends.docker_options import (
    CHECKS,
    check_options,
    default_docker_url,
    docker_mounts,
)
from airflow_gpu_provider.backends.docker_resources import ContainerResources, map_resources
from airflow_gpu_provider.exceptions import GpuTaskError, GpuUnavailableError, MissingDependencyError
from airflow_gpu_provider.host.allocator import Allocation, allocate_gpus
from airflow_gpu_provider.host.inventory import host_devices
from airflow_gpu_provider.images.catalogue import cpu_only_reason
from airflow_gpu_provider.images.dockerfile import BuildOptions, derived_image_spec
from airflow_gpu_provider.images.engine import ensure_derived_image, resolve_image
from airflow_gpu_provider.runtime import BOOTSTRAP_PATH
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings
from airflow_gpu_provider.settings.units import format_bytes, parse_bytes

LABEL = "airflow-gpu-provider"
GO_ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le", "s390x": "s390x"}
NO_GPU_RUNTIME = "could not select device driver"
TOOLKIT_FIX = (
    "Install the NVIDIA Container Toolkit on the Docker host and register it with Docker "
    "(nvidia-ctk runtime configure --runtime=docker, then restart dockerd)"
)


class ContainerOomError(GpuTaskError):
    """The container was killed because it ran out of memory (its memory limit)."""


class _NoGpuRuntime(Exception):
    """The engine cannot start GPU containers (no NVIDIA runtime)."""


def _log_lines(stream: Iterable[tuple[bytes | None, bytes | None]], log: logging.Logger) -> None:
    """Log a container's output line by line as it comes.

    stdout and stderr are kept apart, so a line an unbuffered ``print`` writes in two pieces is never cut by the other.
    """
    pending = [b"", b""]
    for frames in stream:
        for index, data in enumerate(frames):
            if data:
                *lines, pending[index] = (pending[index] + data).split(b"\n")
                for line in lines:
                    log.info("%s", line.decode(errors="replace").rstrip())
    for rest in pending:
        if rest:
            log.info("%s", rest.decode(errors="replace").rstrip())


@dataclass(frozen=True)
class DockerPlan:
    """Everything ``run()`` sends to the engine, decided without touching it.

    :param container: ``create_container`` arguments, except the image (known after the build) and the host config
    :param resources: host config and environment for the request; ``fallback``: the same for a CPU run
    :param hook: ``DockerHook`` arguments
    """

    parent_image: str
    image: ImageSettings
    envelope: Mapping[str, Any]
    summary: Mapping[str, Any]
    container: dict[str, Any]
    host_config: dict[str, Any]
    resources: ContainerResources
    fallback: ContainerResources | None
    on_missing_gpu: str
    hook: dict[str, Any]
    build: BuildOptions
    pull: str = "missing"
    auto_remove: str = "force"
    stop_timeout: float = 10.0
    state_dir: str = "/var/tmp/airflow-gpu-provider"
    mount_tmp_dir: bool = True
    notes: tuple[str, ...] = field(default=())
    # To map the request again onto the devices the host allocator hands out (a local engine, known GPUs)
    requested: ResourceSettings | None = None
    mapping: Mapping[str, Any] = field(default_factory=dict)
    devices_option: str = "auto"
    holder: str = ""
    poll_interval: float = 5.0

    def create_kwargs(self, image: str, *, cpu_fallback: bool = False) -> dict[str, Any]:
        """``create_container`` arguments, with ``host_config`` as ``create_host_config`` arguments."""
        resources = self.fallback if cpu_fallback and self.fallback is not None else self.resources
        environment = {**self.container["environment"], **resources.environment, **self.image.environment}
        return {
            **self.container,
            "image": image,
            "environment": environment,
            "host_config": {**self.host_config, **resources.host_config},
        }


class DockerBackend(Backend[DockerPlan]):
    """Run the task in a Docker container with the requested GPUs, CPUs, memory and ``/dev/shm``.

    The options (``backend_options``) are listed in :mod:`airflow_gpu_provider.backends.docker_options`.
    """

    name = "docker"
    option_names = frozenset(CHECKS)

    def __init__(self, options: Mapping[str, Any] | None = None, log: Any = None) -> None:
        super().__init__(options, log)
        self._client: Any = None
        self._container_id: str | None = None
        self._killed = False

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        """Check names and values of ``backend_options`` at DAG parse time."""
        super().validate_options(options)
        check_options(options)

    # ------------------------------------------------------------------ plan
    def plan(self, request: TaskRequest) -> DockerPlan:
        """Translate the request into container arguments. Reads ``[gpu]`` options only; no engine calls."""
        request.require_single_node(self.name)
        options = self.options
        mapping = {
            "shm_size": parse_bytes(config.get("shm_size")),
            "ipc_mode": options.get("ipc_mode"),
            "device_ids": [str(d) for d in options.get("devices", ())],
            "driver_capabilities": options.get("driver_capabilities", "compute,utility"),
            "group_add": [str(g) for g in options["group_add"]] if "group_add" in options else None,
        }
        resources = map_resources(request.resources, **mapping)
        fallback = None
        if request.resources.requests_gpus:
            cpu_only = request.resources.with_overrides(gpu_count=0, accelerator=None, mig_profile=None)
            fallback = map_resources(cpu_only, **mapping)
        labels = {LABEL: "true", **{f"{LABEL}.{key}": value for key, value in request.labels.items()}}
        container: dict[str, Any] = {
            "command": list(COMMAND),
            "environment": {"PYTHONUNBUFFERED": "1"},
            "labels": labels,
        }
        for key in ("user", "working_dir"):
            if key in options:
                container[key] = options[key]
        host_config: dict[str, Any] = {}
        if "network_mode" in options:
            host_config["network_mode"] = options["network_mode"]
        if options.get("mounts"):
            host_config["mounts"] = docker_mounts(options["mounts"])
        registry = options.get("registry", config.get("image_registry")) or None
        ca_bundle = options.get("ca_bundle", config.get("ca_bundle")) or None
        return DockerPlan(
            parent_image=request.image.parent_image or config.get("default_parent_image"),
            image=request.image,
            envelope=request.envelope,
            summary={
                "backend": self.name,
                "requirements_hash": request.image.requirements_hash,
                "resources": request.resources.describe(),
            },
            container=container,
            host_config=host_config,
            resources=resources,
            fallback=fallback,
            on_missing_gpu=request.on_missing_gpu,
            hook={
                "docker_conn_id": options.get("docker_conn_id"),
                "base_url": options.get("docker_url") or default_docker_url(),
                "version": options.get("api_version", "auto"),
                "timeout": int(options.get("timeout", 60)),
                "tls": {k: options[k] for k in ("tls_ca_cert", "tls_client_cert", "tls_client_key") if k in options},
            },
            build=BuildOptions(
                repository=options.get("repository", "airflow-gpu-derived"),
                registry=registry,
                ca_bundle=ca_bundle,
                uv_source=options.get("uv_source", "worker"),
                compile_bytecode=options.get("compile_bytecode", True),
            ),
            pull=options.get("pull", "missing"),
            auto_remove=options.get("auto_remove", "force"),
            stop_timeout=float(options.get("stop_timeout", 10.0)),
            state_dir=str(options.get("state_dir", config.get("state_dir"))),
            mount_tmp_dir=bool(options.get("mount_tmp_dir", True)),
            notes=resources.notes,
            requested=request.resources,
            mapping=mapping,
            devices_option=str(config.get("devices")),
            holder=f"{request.display_name} run {request.labels.get('run_id', '?')} (docker)",
            poll_interval=config.get("wait_poll_interval"),
        )

    # ------------------------------------------------------------------ run
    def run(self, plan: DockerPlan) -> TaskResult:
        """Find or build the image, run the container to completion, return its result; remove it on every path."""
        client = self._connect(plan)
        for note in plan.notes:
            self.log.warning("%s", note)
        image = self._image(client, plan)
        with self._host_gpus(plan) as allocation:
            if allocation.cpu_fallback:
                return self._run_container(client, plan, image, cpu_fallback=True)
            if allocation.devices:
                ids = [device.id for device in allocation.devices]
                self.log.info("GPUs %s from the host allocator (shared with the local backend's tasks)", ids)
                remapped = map_resources(plan.requested, **{**plan.mapping, "device_ids": ids})  # type: ignore[arg-type]
                plan = dataclasses.replace(plan, resources=remapped)
            return self._run_gpu_container(client, plan, image)

    def _host_gpus(self, plan: DockerPlan) -> Allocation:
        """Devices from the host GPU allocator when the engine is on this host and its GPUs are known.

        Otherwise (a remote engine, explicit ``devices``, or a host whose GPUs NVML and ``[gpu] devices`` do not
        know) Docker hands out GPUs by count, and nothing stops two tasks from sharing one.
        """
        requested = plan.requested
        local_engine = str(plan.hook.get("base_url") or "").startswith("unix://")
        if requested is None or not requested.requests_gpus or plan.mapping.get("device_ids") or not local_engine:
            return Allocation(devices=[])
        present = host_devices(plan.devices_option, requested.gpu_vendor)
        if not present:
            return Allocation(devices=[])
        return allocate_gpus(
            requested,
            present,
            policy=plan.on_missing_gpu,  # type: ignore[arg-type]
            state_dir=plan.state_dir,
            holder=plan.holder,
            log=self.log,
            poll_interval=plan.poll_interval,
        )

    def _run_gpu_container(self, client: Any, plan: DockerPlan, image: str) -> TaskResult:
        """Run with the GPU request; without an NVIDIA runtime, fail naming the fix or fall back to CPU."""
        try:
            return self._run_container(client, plan, image, cpu_fallback=False)
        except _NoGpuRuntime as err:
            requested = plan.summary["resources"].split(",")[0]
            if plan.on_missing_gpu != "cpu" or plan.fallback is None:
                hint = " Waiting cannot help." if plan.on_missing_gpu == "wait" else ""
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

    def _connect(self, plan: DockerPlan) -> Any:
        """A docker-py ``APIClient`` from ``DockerHook`` (which pings the engine and logs in to the registry)."""
        try:
            from airflow.providers.docker.hooks.docker import DockerHook
        except ImportError as err:
            raise MissingDependencyError(f"The 'docker' backend ({err.name})", "docker") from err
        settings = dict(plan.hook)
        tls = settings.pop("tls")
        if tls:
            settings["tls"] = DockerHook.construct_tls_config(
                ca_cert=tls.get("tls_ca_cert"),
                client_cert=tls.get("tls_client_cert"),
                client_key=tls.get("tls_client_key"),
            )
        try:
            self._client = DockerHook(**settings).api_client
        except Exception as err:  # noqa: BLE001 - AirflowException, DockerException, requests errors
            raise GpuTaskError(
                f"Cannot reach the Docker engine at {settings['base_url']}: {err}. Start the Docker daemon on the "
                "worker, or point backend_options docker_url (or DOCKER_HOST) at a running engine."
            ) from None
        return self._client

    def _image(self, client: Any, plan: DockerPlan) -> str:
        """The image to run: the parent image, or its derived image with the requirements installed."""
        parent = resolve_image(client, plan.parent_image, plan.pull, self.log)
        image = plan.parent_image
        if plan.image.requirements:
            uv_binary = self._uv_binary(plan, parent)
            spec = derived_image_spec(plan.parent_image, plan.image, plan.build, uv_binary=uv_binary)
            image, _ = ensure_derived_image(
                client,
                spec,
                parent["Id"],
                lock_dir=f"{plan.state_dir}/docker-builds",
                push=plan.build.registry is not None,
                log=self.log,
            )
        if plan.fallback is not None and plan.resources.host_config.get("device_requests"):
            config_ = parent.get("Config") or {}
            reason = cpu_only_reason(plan.parent_image, config_.get("Env") or (), config_.get("Labels") or {})
            if reason:
                self.log.warning(
                    "GPUs were requested but the image %s looks CPU-only (%s): code inside may not see the GPUs. "
                    "Use a CUDA image such as %s (see airflow_gpu_provider.images.catalogue).",
                    plan.parent_image,
                    reason,
                    config.get("default_parent_image"),
                )
        return image

    def _uv_binary(self, plan: DockerPlan, parent: Mapping[str, Any]) -> str | None:
        """The worker's uv binary when it runs on the parent image's architecture; else ``None`` (pip-install uv)."""
        if plan.image.python_package_installer != "uv" or plan.build.uv_source != "worker":
            return None
        worker = GO_ARCHITECTURES.get(platform.machine(), platform.machine())
        if parent.get("Architecture") != worker:
            self.log.info(
                "The image is %s, the worker %s: uv is pip-installed in the image.", parent.get("Architecture"), worker
            )
            return None
        from uv import find_uv_bin

        return find_uv_bin()

    def _run_container(self, client: Any, plan: DockerPlan, image: str, *, cpu_fallback: bool) -> TaskResult:
        from docker.errors import APIError

        with TaskFiles(self._files(plan, image, cpu_fallback), parent=f"{plan.state_dir}/docker-tasks") as files:
            container_id = self._create(client, plan.create_kwargs(image, cpu_fallback=cpu_fallback), files, plan)
            self._container_id, self._killed = container_id, False
            started = succeeded = False
            try:
                files.copy_in(client, container_id)
                stream = client.attach(container_id, stdout=True, stderr=True, stream=True, demux=True)
                try:
                    client.start(container_id)
                except APIError as err:
                    if NO_GPU_RUNTIME in str(err.explanation):
                        raise _NoGpuRuntime(err.explanation) from None
                    raise GpuTaskError(
                        f"Docker could not start the task container from {image}: {err.explanation}. The image "
                        "needs python3 on its PATH."
                    ) from None
                started = True
                self.log.info("Started container %s from %s", container_id[:12], image)
                _log_lines(stream, self.log)
                if self._killed:
                    raise GpuTaskError(f"Container {container_id[:12]} was stopped because the task was killed.")
                exit_code = int(client.wait(container_id)["StatusCode"])
                if exit_code != 0 and client.inspect_container(container_id)["State"].get("OOMKilled"):
                    limit = plan.create_kwargs(image)["host_config"].get("mem_limit")
                    raise ContainerOomError(
                        f"Container {container_id[:12]} was killed because it ran out of memory (OOM, exit status "
                        f"{exit_code}; memory limit {format_bytes(limit) if limit else 'none'}). Raise memory= or "
                        "reduce the task's memory use."
                    )
                result = files.result(client, container_id)
                value = result_value(result, exit_code, where=f"container {container_id[:12]}")
                succeeded = True
                return TaskResult(value, exit_code)
            finally:
                self._container_id = None
                self._cleanup(client, container_id, plan, started=started, succeeded=succeeded)

    def _create(self, client: Any, kwargs: dict[str, Any], files: TaskFiles, plan: DockerPlan) -> str:
        """Create the container with the worker folder mounted, or without it where the engine cannot see it."""
        from docker.errors import APIError

        host_config = kwargs.pop("host_config")
        files.mounted = plan.mount_tmp_dir
        while True:
            mounts = [*host_config.get("mounts", []), *([files.mount] if files.mounted else [])]
            try:
                config_ = client.create_host_config(**{**host_config, "mounts": mounts or None})
                return str(client.create_container(host_config=config_, **kwargs)["Id"])
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
    def _files(plan: DockerPlan, image: str, cpu_fallback: bool) -> dict[str, bytes]:
        """The runtime and the envelope (with the resource summary the runtime prints first)."""
        envelope = dict(plan.envelope)
        envelope["summary"] = {
            **plan.summary,
            "image": image,
            "resources": plan.summary["resources"] + (" -> CPU fallback" if cpu_fallback else ""),
            # None: the runtime asks nvidia-smi in the container; a CPU task sees no GPU (NVIDIA_VISIBLE_DEVICES=void)
            "gpus": None if plan.fallback is not None and not cpu_fallback else [],
        }
        return {"bootstrap.py": BOOTSTRAP_PATH.read_bytes(), "envelope.json": json.dumps(envelope).encode()}

    def _cleanup(self, client: Any, container_id: str, plan: DockerPlan, *, started: bool, succeeded: bool) -> None:
        """Remove the container (``auto_remove``); a kept one is stopped first. Never raises."""
        from docker.errors import APIError

        keep = started and (plan.auto_remove == "never" or (plan.auto_remove == "success" and not succeeded))
        try:
            if keep:
                client.stop(container_id, timeout=int(plan.stop_timeout))
                self.log.info("Kept container %s for inspection (auto_remove=%r)", container_id[:12], plan.auto_remove)
            else:
                client.remove_container(container_id, force=True)
        except APIError as err:
            if getattr(err, "status_code", None) != 404:
                self.log.warning("Could not clean up container %s: %s", container_id[:12], err)

    def kill(self) -> None:
        """Called from ``on_kill``: stop the container (SIGTERM, then SIGKILL after ``stop_timeout``), remove it."""
        from docker.errors import APIError

        container_id, client = self._container_id, self._client
        if container_id is None or client is None:
            return
        self._killed = True
        self.log.info("Stopping container %s", container_id[:12])
        with contextlib.suppress(APIError):
            client.stop(container_id, timeout=int(self.options.get("stop_timeout", 10)))
        with contextlib.suppress(APIError):
            client.remove_container(container_id, force=True)
