"""The Docker backend's plan: everything ``run()`` sends to the engine, decided without touching it."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from airflow_gpu_provider.backends.docker.container import ContainerResources, map_resources
from airflow_gpu_provider.backends.docker.engine_facts import EngineFacts
from airflow_gpu_provider.backends.docker.images.spec import BuildOptions
from airflow_gpu_provider.backends.docker.options import CONTAINER_DIR, DockerOptions
from airflow_gpu_provider.backends.docker.rootless import engine_notes, on_engine
from airflow_gpu_provider.checkpoint.location import CHECKPOINT_MOUNT, checkpoint_environment, unreachable
from airflow_gpu_provider.host.allocator import HostGpus
from airflow_gpu_provider.policy import Policy
from airflow_gpu_provider.policy.build import BuildPolicy
from airflow_gpu_provider.policy.docker import task_groups, task_user
from airflow_gpu_provider.policy.paths import canonical
from airflow_gpu_provider.policy.users import device_gids
from airflow_gpu_provider.runtime.protocol import RESULT_TO_LOG
from airflow_gpu_provider.settings.image import DEFAULT_PARENT_IMAGE
from airflow_gpu_provider.settings.units import parse_bytes
from airflow_gpu_provider.task.environment import with_user_environment
from airflow_gpu_provider.task.labels import PROVIDER, docker_label
from airflow_gpu_provider.task.request import TaskRequest
from airflow_gpu_provider.task.runtime_zip import FILE_NAME

if TYPE_CHECKING:
    from airflow_gpu_provider.config.worker import GpuConfig

RESULT_PATH = "/tmp/airflow-gpu-result.json"  # where a container of 0.1.0 writes its result (read by its label)
#: the label of a container whose runtime prints its result on its output (``RESULT_TO_LOG``): every container since
#: 0.2.0; one without it (0.1.0's, taken over or resumed after an upgrade) wrote it to :data:`RESULT_PATH`
RESULT_LABEL, RESULT_ON_OUTPUT = docker_label("result"), "output"
COMMAND = ["python3", f"{CONTAINER_DIR}/{FILE_NAME}", f"{CONTAINER_DIR}/envelope.json", RESULT_TO_LOG]


class Engine(NamedTuple):
    """The engine's facts: its Docker connection's extras, read on the worker (:func:`.client.read_engine`).

    :param registry: where derived images are pushed and pulled first (``''``: they stay on the engine)
    :param ca_bundle: the admin's CA bundle of derived-image builds: used where the task names none, always allowed
    :param parent_image: the image of tasks whose ``ImageSettings.parent_image`` is unset
    :param shm_size: ``/dev/shm`` of containers whose ``ResourceSettings.shm_size`` is unset (capped at the task's
        memory; Docker's own 64 MB breaks PyTorch DataLoader workers)
    """

    registry: str = ""
    ca_bundle: str = ""
    parent_image: str = DEFAULT_PARENT_IMAGE
    shm_size: str = "8Gi"


@dataclass(frozen=True)
class DockerPlan:
    """The container of one task try.

    :param container: ``create_container`` arguments, except the image (known after the build) and the host config
    :param resources: host config and environment for the request; ``fallback``: the same on the CPU only
    :param mapping: the arguments the resources were mapped with, to map them again onto the devices the host
        allocator hands out
    :param stop_timeout: seconds between SIGTERM and SIGKILL when the container is stopped
    :param poll_interval: seconds between two looks of a deferred task's trigger (``[gpu] poll_interval``)
    :param cuda_image: a CUDA image to suggest when a GPU task's image looks CPU-only (``Engine.parent_image``)
    :param notes: what the plan could not give the task (beyond the resource mapping's notes), for its log
    :param policy: the worker's ``[gpu]`` allow-lists, which the whole create call must meet
    :param cache_size: bytes the derived images of a local engine may take (``[gpu] cache_size``; 0: no limit)
    :param engine: the engine the run found (:meth:`on`), whose create calls :func:`.rootless.on_engine` adapts
    """

    request: TaskRequest
    options: DockerOptions
    parent_image: str
    container: dict[str, Any]
    host_config: dict[str, Any]
    resources: ContainerResources
    fallback: ContainerResources | None
    build: BuildOptions
    host: HostGpus
    mapping: dict[str, Any] = field(default_factory=dict)
    stop_timeout: float = 30.0
    poll_interval: float = 1.0
    cuda_image: str = ""
    notes: tuple[str, ...] = ()
    policy: Policy | None = None
    cache_size: int = 0
    engine: EngineFacts | None = None
    allow_unenforced: bool = False  # [gpu_policy] allow_unenforced_gpu_shares (host/mps.py)

    def create_kwargs(self, image: str, *, cpu_fallback: bool = False) -> dict[str, Any]:
        """``create_container`` arguments, with ``host_config`` as ``create_host_config`` arguments."""
        resources = self.fallback if cpu_fallback and self.fallback is not None else self.resources
        environment = with_user_environment(
            {**self.container["environment"], **resources.environment},
            self.request.image.environment,
            self.request.resources.gpu_vendor,
        )
        kwargs = {
            **self.container,
            "image": image,
            "environment": environment,
            "host_config": {**self.host_config, **resources.host_config},
        }
        return on_engine(kwargs, self.engine)

    def on(self, engine: EngineFacts) -> DockerPlan:
        """The same plan for the engine the run found, with what the task log must say of it."""
        notes = engine_notes(self.request.resources, engine)
        return dataclasses.replace(self, engine=engine, notes=(*self.notes, *notes))

    @property
    def try_number(self) -> str:
        """The try this plan runs, as its labels carry it (``durable.py`` records it with the container)."""
        return self.request.labels.get("try_number", "")

    def on_devices(self, device_ids: Sequence[str]) -> DockerPlan:
        """The same plan with the GPUs requested by id (those the host allocator handed out)."""
        remapped = map_resources(self.request.resources, **{**self.mapping, "device_ids": list(device_ids)})
        return dataclasses.replace(self, resources=remapped)


def plan_container(
    request: TaskRequest, options: DockerOptions, conf: GpuConfig, engine: Engine | None = None
) -> DockerPlan:
    """Map a request onto container arguments, with the worker's ``[gpu]`` options and the engine's facts.

    ``engine``: its connection's extras (default: none set). No engine calls.

    Users and groups are resolved in this host's passwd and group databases (``policy/users.py``): the engine gets
    numbers only, never a name the task's image would resolve.
    """
    policy, engine = Policy.of(conf), engine or Engine()
    mapping: dict[str, Any] = {
        "shm_size": parse_bytes(engine.shm_size),
        "ipc_mode": options.ipc_mode,
        "device_ids": list(options.devices),
        "driver_capabilities": options.driver_capabilities,
        "group_add": task_groups(request.display_name, options.group_add or (), policy),
        "device_groups": device_gids(),
        "processes": request.processes_per_node,
    }
    resources = request.resources
    fallback = map_resources(resources.without_gpus(), **mapping) if resources.requests_gpus else None
    container: dict[str, Any] = {
        "command": list(COMMAND),
        "environment": {"PYTHONUNBUFFERED": "1"},
        "labels": {
            PROVIDER: "true",
            RESULT_LABEL: RESULT_ON_OUTPUT,
            **{docker_label(key): value for key, value in request.labels.items()},
        },
    }
    # rule D2: a task runs as the worker's own user unless the admin allows another (policy/docker.py)
    container["user"] = task_user(request.display_name, options.user, policy)
    if options.user is None and os.geteuid() != 0:
        container["environment"]["HOME"] = "/tmp"  # a user the image may not know has no home
    if options.working_dir is not None:
        container["working_dir"] = options.working_dir
    # rule D1: no privilege can be gained inside (setuid binaries), no capability is kept unless allowed.
    host_config: dict[str, Any] = {"security_opt": ["no-new-privileges:true"], "cap_drop": ["ALL"]}
    if options.cap_add:
        host_config["cap_add"] = list(options.cap_add)
    if options.network_mode is not None:
        host_config["network_mode"] = options.network_mode
    mounts = [
        {"Target": m["target"], "Source": _source(m), "Type": m.get("type", "bind"),
         "ReadOnly": bool(m.get("read_only", False)),
         **({"VolumeOptions": {"NoCopy": True}} if m.get("type") == "volume" else {})}  # no copy-up from the image
        for m in options.mounts
    ]  # fmt: skip
    checkpoint_mounts, notes = checkpoint_mount(request, options, container)
    mounts += checkpoint_mounts
    if mounts:
        host_config["mounts"] = mounts
    return DockerPlan(
        request=request,
        options=options,
        parent_image=request.image.parent_image or engine.parent_image,
        container=container,
        host_config=host_config,
        resources=map_resources(resources, **mapping),
        fallback=fallback,
        build=BuildOptions(
            repository=options.repository,
            registry=options.registry or engine.registry or None,
            ca_bundle=options.ca_bundle or engine.ca_bundle or None,
            policy=BuildPolicy.of(conf, engine.ca_bundle),
            uv_source=options.uv_source,
            compile_bytecode=options.compile_bytecode,
        ),
        host=HostGpus.configured(conf, only=options.devices),
        mapping=mapping,
        stop_timeout=conf.grace(options.stop_timeout),
        poll_interval=conf.poll_interval,
        cuda_image=engine.parent_image,
        notes=notes,
        policy=policy,
        cache_size=parse_bytes(conf.cache_size) if conf.cache_size else 0,
        allow_unenforced=conf.allow_unenforced_gpu_shares,
    )


def _source(mount: dict[str, Any]) -> str:
    """A bind source as the policy checked it (``//data/`` is ``/data``): the engine gets no other name."""
    source = str(mount.get("source", ""))
    return canonical(source) if mount.get("type", "bind") == "bind" else source


def checkpoint_mount(
    request: TaskRequest, options: DockerOptions, container: dict[str, Any]
) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    """The task's checkpoint folder in the container (``container`` gets its environment, and maybe its user).

    A URI root: the URI itself. A path root on a local engine: the worker's folder, bind-mounted read-write at
    :data:`CHECKPOINT_MOUNT` (the container runs as the worker's user, so it may write to the worker's private
    folder, and the worker may delete what it wrote). A remote engine cannot reach it
    (:func:`~airflow_gpu_provider.checkpoint.location.unreachable`: an error with ``resume=True``, else a note).

    :return: the mounts, and the notes for the task's log
    """
    location = request.checkpoint
    if location is not None and location.is_uri:
        container["environment"].update(checkpoint_environment(location.path))
    if location is None or location.is_uri:
        return [], ()
    if not options.engine_is_local:
        fix = "Make checkpoint= (or [gpu] checkpoint_root) an object-storage URI"
        note = unreachable(request.display_name, location, resume=request.resume, where="on a remote engine", fix=fix)
        return [], (note,)
    container["environment"].update(checkpoint_environment(CHECKPOINT_MOUNT))
    return [{"Target": CHECKPOINT_MOUNT, "Source": location.path, "Type": "bind", "ReadOnly": False}], ()
