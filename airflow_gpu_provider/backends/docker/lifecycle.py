"""One task container's life on the engine: created (the whole call checked), started, read back, removed.

The Docker backend runs these steps in one worker try (``run``), or across a deferral (``start`` in one try, ``resume``
after the trigger fired), or for a container an earlier try left running (reattach): each step is one function.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from docker.errors import APIError, NotFound
from docker.utils import format_environment

from airflow_gpu_provider.backends.docker.durable import DEPLOYMENT_LABEL
from airflow_gpu_provider.backends.docker.files import TaskFiles, read_result, release, writable_mounts
from airflow_gpu_provider.backends.docker.orphans import AUTO_REMOVE_LABEL, DURABLE_LABEL, WORKER_LABEL
from airflow_gpu_provider.backends.docker.plan import RESULT_LABEL, RESULT_ON_OUTPUT
from airflow_gpu_provider.backends.docker.rootless import PODMAN_FIX, cdi_requested
from airflow_gpu_provider.exceptions import OOM_REMEDY, GpuTaskError, HostOutOfMemoryError
from airflow_gpu_provider.host.keeper import Keeper
from airflow_gpu_provider.host.workers import deployment, worker_identity
from airflow_gpu_provider.policy import Policy
from airflow_gpu_provider.policy.engine import check_create, check_volume
from airflow_gpu_provider.settings.units import format_bytes
from airflow_gpu_provider.task.output import LineSplitter, ResultLines, TaskLog
from airflow_gpu_provider.task.result import MAX_RESULT_BYTES, ResultError, TaskResult, result_of_lines, task_result

if TYPE_CHECKING:
    from airflow_gpu_provider.backends.docker.plan import DockerPlan

NO_GPU_RUNTIME = "could not select device driver"


class ContainerOomError(HostOutOfMemoryError):
    """The container was killed because it ran out of memory (its memory limit): an ``on_oom`` memory step."""


class NoGpuRuntime(Exception):
    """The engine cannot start GPU containers (no NVIDIA runtime); ``fix``: what would make it, when not the toolkit."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.fix = fix


def log_lines(stream: Iterable[tuple[bytes | None, bytes | None]], log: logging.Logger) -> ResultLines:
    """Log a container's output line by line as it comes (:mod:`~airflow_gpu_provider.task.output`); its result lines.

    stdout and stderr are split apart, so a line an unbuffered ``print`` writes in two pieces is never cut by the other.
    The runtime's result line on stdout (the first of each pair) is not logged: it is returned, read only from a
    stream this try attached to before the start (an engine's log mixes stdout and stderr: :func:`result_in_logs`).
    """
    results = ResultLines(MAX_RESULT_BYTES)
    splitters, logs = (LineSplitter(), LineSplitter()), (TaskLog(log), TaskLog(log))
    for frames in stream:
        for splitter, task_log, given in zip(splitters, logs, frames, strict=False):
            data = results.feed(given or b"") if splitter is splitters[0] else given
            for line in splitter.feed(data or b""):
                task_log(line)
    for splitter, task_log, rest in zip(splitters, logs, (results.flush(), b""), strict=True):
        for line in [*splitter.feed(rest), *splitter.flush()]:
            task_log(line)
        task_log.flush()
    return results


def create_body(
    client: Any, kwargs: dict[str, Any], files: TaskFiles, plan: DockerPlan, *, durable: bool = False
) -> dict[str, Any]:
    """The whole create call's body, after every merge, as the engine will get it (docker-py's own).

    :param durable: the container may outlive this worker process (deferred, or reattachable by a later try)
    """
    labels = {WORKER_LABEL: worker_identity(), AUTO_REMOVE_LABEL: plan.options.auto_remove}
    labels[DEPLOYMENT_LABEL] = deployment()  # the authorization plugin lets a deployment reach only its own
    if durable:
        labels[DURABLE_LABEL] = "true"
    create = {**kwargs, "labels": {**kwargs["labels"], **labels}}
    host_config = create.pop("host_config")
    mounts = [*host_config.get("mounts", []), *([files.mount] if files.mounted else [])]
    environment = format_environment(create.pop("environment", None) or {})
    create["environment"] = client._proxy_configs.inject_proxy_environment(environment) or None  # as docker-py does
    host_config = client.create_host_config(**{**host_config, "mounts": mounts or None})
    return dict(client.create_container_config(host_config=host_config, **create))


def final_call(
    client: Any, kwargs: dict[str, Any], files: TaskFiles, plan: DockerPlan, *, durable: bool = False
) -> dict[str, Any]:
    """:func:`create_body`, checked against the worker's ``[gpu]`` policy before it is returned (rule A2).

    The check is :func:`~airflow_gpu_provider.policy.engine.check_create`, the very function the engine's
    authorization plugin runs: nothing reaches the engine that the policy refuses, whoever sends it.
    """
    body = create_body(client, kwargs, files, plan, durable=durable)
    rootless = plan.engine is not None and plan.engine.rootless  # its root is the worker; a CDI name no path
    check_create(body, plan.policy or Policy.current(), rootless=rootless)
    for mount in (body.get("HostConfig") or {}).get("Mounts") or []:
        if mount.get("Type") == "volume":  # rule D5: a listed volume is no bind or network mount in disguise
            try:
                found = client.inspect_volume(mount["Source"])
            except NotFound:
                found = None  # the engine makes a plain local one
            check_volume(found, mount["Source"])
    return body


def create(
    client: Any, kwargs: dict[str, Any], files: TaskFiles, plan: DockerPlan, log: logging.Logger, *, durable: bool
) -> str:
    """Create the container with the worker folder mounted, or without it where the engine cannot see it.

    A lasting container's folder is kept with it (``files.kept``: :func:`.files.release` removes it).

    :raises GpuTaskError: when the files would have to be uploaded into a container with a writable host folder
    """
    files.mounted = plan.options.mount_tmp_dir
    while True:
        body = final_call(client, kwargs, files, plan, durable=durable)
        writable = writable_mounts(body.get("HostConfig") or {})
        if not files.mounted and writable:
            raise GpuTaskError(
                f"The task's files cannot be copied into a container that may write to a host folder or volume "
                f"({', '.join(writable)}): the engine would unpack them as root into it. Let the engine see the "
                "worker's folders (backend_options mount_tmp_dir=True, a local engine), or drop the writable mount."
            )
        try:
            container_id = str(client.create_container_from_config(body)["Id"])
            files.kept = files.lasting and files.mounted
            return container_id
        except APIError as err:
            if files.mounted and str(files.path) in str(err.explanation):
                log.warning(
                    "The Docker engine cannot see the worker's folder %s (a remote engine?); the task's files are "
                    "copied through the Docker API instead. backend_options mount_tmp_dir=False skips this attempt.",
                    files.path,
                )
                files.mounted = False
                continue
            if cdi_requested(kwargs["host_config"].get("devices")):  # an engine that takes no CDI names (Podman 4)
                raise NoGpuRuntime(f"it refused the CDI devices: {err.explanation}", fix=PODMAN_FIX) from None
            raise GpuTaskError(
                f"Docker could not create the task container from {kwargs['image']}: {err.explanation}"
            ) from None


def start(client: Any, container_id: str, image: str) -> None:
    """Start a created container; a failure names its cause (no GPU runtime: :class:`NoGpuRuntime`)."""
    try:
        client.start(container_id)
    except APIError as err:
        if NO_GPU_RUNTIME in str(err.explanation):
            raise NoGpuRuntime(err.explanation) from None
        missing = "executable file not found" in str(err.explanation)  # the image has no python3
        hint = " The image needs python3 on its PATH." if missing else ""
        raise GpuTaskError(
            f"Docker could not start the task container from {image}: {err.explanation}.{hint}"
        ) from None


def keep_locks(client: Any, container_id: str, locks: list[int], log: logging.Logger) -> Keeper | None:
    """The GPU locks live as long as the container, even if this worker is killed (host/keeper.py)."""
    if not locks:
        return None
    try:
        return Keeper(client.inspect_container(container_id)["State"]["Pid"], locks, container_id=container_id)
    except (OSError, ValueError) as err:
        log.warning("The GPU locks are held by this worker alone (%s): if it dies, so do they.", err)
        return None


def output(client: Any, container_id: str, since: float | None = None) -> Iterable[tuple[bytes | None, bytes | None]]:
    """The container's output until it ends, for a container this try did not attach to.

    :param since: from this time (seconds since the epoch; a second earlier, so that nothing is missed), else all
    """
    after = {} if since is None else {"since": max(float(since) - 1, 0.001)}
    for chunk in client.logs(container_id, stdout=True, stderr=True, stream=True, follow=True, **after):
        yield chunk, None


def rest_of_output(
    client: Any, container_id: str, logged: dict[str, Any], log: logging.Logger
) -> Iterable[tuple[bytes | None, bytes | None]]:
    """What of a deferred container's output its trigger did not log (``logged``: its event's ``output``)."""
    if logged.get("logged"):
        log.info("The container's output was logged while the task was deferred (above)")
        return ()
    return output(client, container_id, since=logged.get("until"))


def collect(client: Any, container_id: str, mem_limit: int | None, streamed: ResultLines | None) -> TaskResult:
    """Wait for the container to end and read what the task gave back (its output was logged already).

    :param streamed: the result lines of the output this try attached to (its own container: :func:`log_lines`);
        ``None``: the result is read from the engine, as the container's label says its runtime wrote it
    :raises ContainerOomError: when the engine killed it for its memory limit
    """
    where = f"container {container_id[:12]}"
    removed = GpuTaskError(f"Container {container_id[:12]} was removed before its result could be read.")
    try:
        exit_code = int(client.wait(container_id)["StatusCode"])
        found = client.inspect_container(container_id) if exit_code != 0 or streamed is None else None
    except NotFound:
        raise removed from None
    if found is not None and found["State"].get("OOMKilled"):
        raise ContainerOomError(
            f"Container {container_id[:12]} was killed because it ran out of memory (OOM, exit status {exit_code}; "
            f"memory limit {format_bytes(mem_limit) if mem_limit else 'none'}). " + OOM_REMEDY[ContainerOomError.kind]
        )
    if streamed is not None:
        result = result_of_lines(streamed, where)
    elif ((found or {}).get("Config") or {}).get("Labels", {}).get(RESULT_LABEL) == RESULT_ON_OUTPUT:
        result = result_in_logs(client, container_id)
    else:  # a container of 0.1.0 (no label): its runtime wrote the file; never judged by what the output lacks
        result = read_result(client, container_id)
    if result is None and not _exists(client, container_id):  # never a success with a lost return value
        raise removed
    return task_result(result, exit_code, where=where)


#: log entries of the tail that holds a whole result line: the engine stores output in entries of 16 KiB at most
RESULT_TAIL = MAX_RESULT_BYTES // 2**14 + 2


def result_in_logs(client: Any, container_id: str) -> dict[str, Any] | None:
    """The result line at the end of a container's stdout, read from the engine's log (a bounded tail of it).

    For a container this try did not attach to (taken over, resumed after a deferral). stdout alone: a line the task
    writes on stderr meanwhile cannot cut the result line. Never more than the tail that holds the longest result.
    """
    results, read = ResultLines(MAX_RESULT_BYTES), 0
    chunks = client.logs(container_id, stdout=True, stderr=False, stream=True, follow=False, tail=RESULT_TAIL)
    try:
        for chunk in chunks:
            read += len(chunk)
            if read > MAX_RESULT_BYTES + RESULT_TAIL * 2**14:
                raise ResultError(f"The output of container {container_id[:12]} is larger than its log's tail.")
            results.feed(chunk)
    finally:
        chunks.close()
    return result_of_lines(results, f"container {container_id[:12]}")


def _exists(client: Any, container_id: str) -> bool:
    try:
        client.inspect_container(container_id)
    except NotFound:
        return False
    return True


def cleanup(
    client: Any,
    container_id: str,
    plan: DockerPlan,
    log: logging.Logger,
    *,
    started: bool,
    succeeded: bool,
) -> None:
    """Remove the container (``auto_remove``); a kept or running one (a timeout) is stopped first. Never raises.

    Stopped: SIGTERM, then SIGKILL after the grace period (time for a last checkpoint).
    """
    auto_remove = plan.options.auto_remove
    keep = started and (auto_remove == "never" or (auto_remove == "success" and not succeeded))
    try:
        if keep or (started and not succeeded):
            client.stop(container_id, timeout=round(plan.stop_timeout))
        if keep:
            log.info("Kept container %s for inspection (auto_remove=%r)", container_id[:12], auto_remove)
        else:
            remove(client, container_id, plan.host.state_dir)
    except APIError as err:
        if getattr(err, "status_code", None) != 404:
            log.warning("Could not clean up container %s: %s", container_id[:12], err)


def remove(client: Any, container_id: str, state_dir: str | None) -> None:
    """Remove a container, then its lasting files folder (``state_dir``: the worker's, where it lies)."""
    found = None
    if state_dir is not None:
        with contextlib.suppress(APIError):
            found = client.inspect_container(container_id)
    client.remove_container(container_id, force=True)
    if state_dir is not None:
        release(found, state_dir)


def stop(client: Any, container_id: str, timeout: float, state_dir: str | None = None) -> None:
    """Stop (SIGTERM, SIGKILL after ``timeout``) and remove a container (:func:`remove`); never raises."""
    with contextlib.suppress(APIError):
        client.stop(container_id, timeout=round(timeout))
    with contextlib.suppress(APIError):
        remove(client, container_id, state_dir)
