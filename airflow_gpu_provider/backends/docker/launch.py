"""One container a try starts: its image, its GPUs from the host allocator, the create call, the start.

:func:`launch` is what a try does before the container's output is followed, on the synchronous and the deferred
path alike. It hands back what it started (:class:`Started`): what following the container needs, and what must
last as long as that (the GPU locks, the task's files, the watch for GPU faults: :attr:`Started.held`). Whatever
fails before the start removes what was made.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_gpu_provider.backends.docker import durable, lifecycle
from airflow_gpu_provider.backends.docker.files import TaskFiles
from airflow_gpu_provider.backends.docker.images.task_image import task_image
from airflow_gpu_provider.backends.docker.lifecycle import NoGpuRuntime
from airflow_gpu_provider.backends.docker.plan import CONTAINER_DIR, DockerPlan
from airflow_gpu_provider.backends.docker.rootless import PODMAN_FIX, dropped_limits, gpu_problem
from airflow_gpu_provider.exceptions import GpuUnavailableError
from airflow_gpu_provider.host.allocator import Allocation
from airflow_gpu_provider.host.keeper import Keeper
from airflow_gpu_provider.host.mps import ShareEnforcer, shared
from airflow_gpu_provider.host.quarantine import on_fault
from airflow_gpu_provider.task.runtime_zip import FILE_NAME, compiled

TOOLKIT_FIX = (
    "Install the NVIDIA Container Toolkit on the Docker host and register it with Docker "
    "(nvidia-ctk runtime configure --runtime=docker, then restart dockerd)"
)


@dataclass
class Started:
    """A container a try created and started.

    :param record: what the task state store keeps of it (:meth:`.JobRecord.entry`)
    :param stream: its attached output (``None``: read from the engine when followed)
    :param keeper: the process that holds its GPU locks as long as it runs (:mod:`~...host.keeper`)
    :param locks: the descriptors of its GPU locks
    :param lasting: it may outlive this worker process (deferred, or durable with a task state store)
    :param held: the GPUs, the task's files and the watch for GPU faults: closed once it is followed
    """

    container_id: str
    record: dict[str, Any]
    mem_limit: int | None
    stream: Any
    keeper: Keeper | None
    locks: list[int]
    lasting: bool
    held: contextlib.ExitStack


def launch(
    client: Any,
    plan: DockerPlan,
    store: Any,
    log: logging.Logger,
    *,
    lasting: bool,
    attach: bool,
    created: Callable[[str | None], None],
) -> Started:
    """Find or build the image, take the GPUs, create and start the container.

    :param store: the task instance's task state store, where a lasting container is recorded before it starts
    :param attach: attach to its output before the start (a run that follows it)
    :param created: told the container's id once it exists, ``None`` when it was removed again (``kill`` stops it)
    """
    for note in (*plan.notes, *plan.resources.notes):
        log.warning("%s", note)
    held = contextlib.ExitStack()
    try:
        image = held.enter_context(task_image(client, plan, log))  # a derived image stays in use while it runs
        allocation = held.enter_context(host_gpus(plan, log))
        held.enter_context(on_fault(plan.host, allocation.devices, log, positional=True))  # positional: 0, 1, ...
        enforcer = ShareEnforcer(plan.host.state_dir, log, in_container=True, allow_unenforced=plan.allow_unenforced)
        share = shared(enforcer, allocation, plan.request)  # PyTorch's cap in the container, said in its log
        how = {"store": store, "log": log, "held": held, "lasting": lasting, "attach": attach, "created": created}
        how["share"] = None if share is None else share.share
        if allocation.cpu_fallback:
            return _start(client, plan, image, allocation.fds, cpu_fallback=allocation.reason, **how)
        if allocation.devices:
            ids = [device.id for device in allocation.devices]
            log.info("GPUs %s from the host allocator (shared with the local backend's tasks)", ids)
            plan = plan.on_devices(ids)
        return _start_gpu_container(client, plan, image, allocation.fds, **how)
    except BaseException as err:
        held.__exit__(type(err), err, err.__traceback__)  # the GPUs go, a GPU fault is quarantined, files removed
        raise


def host_gpus(plan: DockerPlan, log: logging.Logger) -> Allocation:
    """Devices from the host GPU allocator (which a task's ``devices`` only narrow) on a host whose GPUs are known.

    Otherwise (a remote engine, or GPUs neither NVML nor ``[gpu] devices`` knows) Docker hands out GPUs by count.
    """
    resources = plan.request.resources
    if not resources.requests_gpus:
        return Allocation(devices=[])
    present = plan.host.present(resources.gpu_vendor) if plan.options.engine_is_local else []
    if not present and resources.share is not None:
        where = "a remote Docker engine" if not plan.options.engine_is_local else "a host whose GPUs are not known"
        raise GpuUnavailableError(
            f"Requested {resources.describe().split(',')[0]} on {where}: a share of a GPU is placed by the host "
            "allocator among the GPUs of the worker's host (NVML, or [gpu] devices). Give the task a whole GPU there."
        )
    if not present:
        return Allocation(devices=[])
    return plan.host.allocate(plan.request, backend="docker", log=log, present=present)


def _start_gpu_container(client: Any, plan: DockerPlan, image: str, locks: list[int], **how: Any) -> Started:
    """Start with the GPU request; without an NVIDIA runtime, fail naming the fix or fall back to the CPU."""
    try:
        return _start(client, plan, image, locks, cpu_fallback=None, **how)
    except NoGpuRuntime as err:
        requested = plan.request.resources.describe().split(",")[0]
        policy = plan.request.missing_gpu
        if not policy.runs_on_cpu:
            hint = " Waiting cannot help." if policy.waits else ""
            raise GpuUnavailableError(
                f"Requested {requested}, but the Docker engine cannot start GPU containers: {err}. "
                f"{err.fix or TOOLKIT_FIX}; or set on_missing_gpu='cpu' to run on CPU instead.{hint}"
            ) from None
        how["log"].warning(
            "Requested %s, but the Docker engine cannot start GPU containers (%s). on_missing_gpu='cpu': "
            "running on CPU instead. To use the GPUs: %s.",
            requested,
            err,
            err.fix or TOOLKIT_FIX,
        )
        reason = f"the Docker engine cannot start GPU containers ({err})"
        return _start(client, plan, image, locks, cpu_fallback=reason, **how)


def _start(
    client: Any,
    plan: DockerPlan,
    image: str,
    locks: list[int],
    *,
    cpu_fallback: str | None,
    store: Any,
    log: logging.Logger,
    held: contextlib.ExitStack,
    lasting: bool,
    attach: bool,
    created: Callable[[str | None], None],
    share: Mapping[str, Any] | None,
) -> Started:
    """Create the container, record it (a lasting one), start it; remove it if that fails.

    :param cpu_fallback: why it runs on the CPU instead of its GPUs (``on_missing_gpu="cpu"``), or ``None``
    :param share: the share of a GPU it holds, as it is enforced (``host/mps.py``)
    """
    files = _files(plan, image, cpu_fallback, share)
    task_files = held.enter_context(TaskFiles(files, parent=f"{plan.host.state_dir}/docker-tasks", lasting=lasting))
    kwargs = plan.create_kwargs(image, cpu_fallback=cpu_fallback is not None)
    mem_limit = kwargs["host_config"].get("mem_limit")
    container_id = lifecycle.create(client, kwargs, task_files, plan, log, durable=lasting)
    created(container_id)
    record = durable.RECORD.entry(container_id, str(plan.options.engine_url), plan.try_number)
    started = False
    try:
        _engine_took(client, container_id, kwargs, plan, log)
        task_files.copy_in(client, container_id)
        if lasting:  # before the start: a worker killed from now on leaves a container the next try finds
            durable.RECORD.record(store, container_id, record["engine"], plan.try_number)
        stream = client.attach(container_id, stdout=True, stderr=True, stream=True, demux=True) if attach else None
        lifecycle.start(client, container_id, image)
        started = True
        keeper = lifecycle.keep_locks(client, container_id, locks, log)
        log.info("Started container %s from %s", container_id[:12], image)
    except BaseException:
        if not lasting or durable.RECORD.owns(store, container_id, plan.try_number, log):
            lifecycle.cleanup(client, container_id, plan, log, started=started, succeeded=False)
            if lasting:
                durable.RECORD.forget(store)
        created(None)
        raise
    return Started(container_id, record, mem_limit, stream, keeper, list(locks), lasting, held)


def _engine_took(client: Any, container_id: str, kwargs: dict[str, Any], plan: DockerPlan, log: logging.Logger) -> None:
    """On a rootless engine or Podman: the created container has its GPUs (else :class:`NoGpuRuntime`).

    A limit the engine dropped is said in the task log (:mod:`.rootless`).
    """
    engine = plan.engine
    if engine is None or not (engine.rootless or engine.podman):
        return
    created = client.inspect_container(container_id)
    for limit in dropped_limits(created, kwargs):
        log.warning("The engine dropped the container's %s limit: the container has none (treated as absent).", limit)
    problem = gpu_problem(created, kwargs)
    if problem is not None:
        raise NoGpuRuntime(problem, fix=PODMAN_FIX if engine.podman else "")


def _files(plan: DockerPlan, image: str, cpu_fallback: str | None, share: Any = None) -> dict[str, bytes]:
    """The runtime (precompiled by the worker's Python) and the envelope (with the summary the runtime prints first)."""
    # gpus None: the runtime asks nvidia-smi in the container (a CPU task gets NVIDIA_VISIBLE_DEVICES=void)
    envelope = plan.request.runtime_envelope(
        backend="docker",
        image=image,
        gpus=None,
        cpu_fallback=cpu_fallback is not None,
        fallback_reason=cpu_fallback or "",
        share=share,
    )
    return {FILE_NAME: compiled(f"{CONTAINER_DIR}/{FILE_NAME}"), "envelope.json": json.dumps(envelope).encode()}
