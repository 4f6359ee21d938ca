"""The files a task container gets from the worker (the runtime and the envelope) and the one it gives back.

Inputs: a fresh folder, mounted **read-only** at ``/airflow-gpu``. It lies in the worker's private state dir (0700),
so no other user of the host can reach it, read the envelope or plant a module there; being read-only, nothing the
container writes (a setuid binary, a symlink) ever lands in a host path. A container that may outlive its try
(deferred, durable) keeps its folder (``lasting-*``): it is removed with the container (:func:`release`), or by the
next try on the host once its worker is gone and no container mounts it (:func:`sweep`). Where the engine cannot see
the worker's files (a remote engine, a worker in a container), the inputs are copied in through the Docker API
instead, never into a container with a writable host folder: the engine unpacks an upload as root, into the
container's mounts too, and what it writes there (a setuid file) would land on the host.

The task's checkpoint folder (a path root) is the one folder the container may write to on the worker: private
to the worker like the inputs, bind-mounted read-write, with the container running as the worker's user.

Output: the runtime prints its result on the container's output (``lifecycle.py``). A container of 0.1.0 (no
``RESULT_LABEL``) wrote it inside the container (``/tmp``), read here through the Docker API after it stopped: a
regular file, of bounded size, whatever the container left there (:func:`read_result`, for one release).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from docker.errors import NotFound

from airflow_gpu_provider.backends.docker.plan import CONTAINER_DIR, RESULT_PATH, DockerPlan
from airflow_gpu_provider.host.state import folder_owner, task_folder
from airflow_gpu_provider.host.workers import is_dead
from airflow_gpu_provider.task.result import MAX_RESULT_BYTES, ResultError
from airflow_gpu_provider.task.runtime_zip import FILE_NAME
from airflow_gpu_provider.task.runtime_zip import archive as runtime_archive

LASTING = "lasting"  # the prefix of the folders that live as long as their container


class TaskFiles:
    """The container's inputs in a fresh folder of the worker's private state dir; removed on exit, unless kept.

    :param files: file name -> content, placed in ``/airflow-gpu``
    :param parent: where the folder is created (``<state_dir>/docker-tasks``, private to the worker)
    :param lasting: for a container that may outlive this try: once it mounts the folder, the folder is
        :attr:`kept`, and removed with the container
    """

    def __init__(self, files: Mapping[str, bytes], *, parent: str | os.PathLike[str], lasting: bool = False) -> None:
        self.files = dict(files)
        self.path = task_folder(parent, prefix=LASTING if lasting else "task")
        self.lasting = lasting
        self.kept = False
        for name, data in self.files.items():
            (self.path / name).write_bytes(data)
            (self.path / name).chmod(0o644)
        # Readable by the container's user, whoever that is; others cannot reach it through the private parent.
        self.path.chmod(0o755)
        self.mounted = True

    def __enter__(self) -> TaskFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.kept:
            shutil.rmtree(self.path, ignore_errors=True)

    @property
    def mount(self) -> dict[str, Any]:
        """The read-only bind mount, in the Docker API's form."""
        return {"Target": CONTAINER_DIR, "Source": str(self.path), "Type": "bind", "ReadOnly": True}

    def archive(self) -> bytes:
        """The files as a tar of ``/airflow-gpu``, the worker's own (the runtime as its plain archive, the smaller)."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            folder = tarfile.TarInfo(CONTAINER_DIR.strip("/"))
            folder.type, folder.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(_owned(folder))
            for name, given in self.files.items():
                data = runtime_archive() if name == FILE_NAME else given
                info = tarfile.TarInfo(f"{folder.name}/{name}")
                info.size, info.mode = len(data), 0o644
                tar.addfile(_owned(info), io.BytesIO(data))
        return buffer.getvalue()

    def copy_in(self, client: Any, container_id: str) -> None:
        """Without the mount: unpack the files into the created container (never one with a writable host folder)."""
        if not self.mounted:
            client.put_archive(container_id, "/", self.archive())


def _owned(member: tarfile.TarInfo) -> tarfile.TarInfo:
    member.uid, member.gid = os.geteuid(), os.getegid()  # what the container's own user could have written
    return member


def writable_mounts(host_config: Mapping[str, Any]) -> list[str]:
    """The targets of a create body's mounts that the container may write through (a host folder, a volume)."""
    return [
        str(mount.get("Target"))
        for mount in host_config.get("Mounts") or []
        if mount.get("Type") in ("bind", "volume") and not mount.get("ReadOnly")
    ]


def _lasting_folder(source: str, state_dir: str) -> Path | None:
    path = Path(source)
    tasks = Path(state_dir) / "docker-tasks"
    return path if path.parent == tasks and path.name.startswith(f"{LASTING}-") else None


def release(found: Mapping[str, Any] | None, state_dir: str) -> None:
    """Remove the files folder of a removed container (``found``: its inspect), when it is a lasting one of ours."""
    for mount in (found or {}).get("Mounts") or []:
        folder = _lasting_folder(str(mount.get("Source") or ""), state_dir)
        if mount.get("Destination") == CONTAINER_DIR and folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def sweep(containers: list[dict[str, Any]], state_dir: str) -> None:
    """Remove the lasting folders whose worker is gone and which none of ``containers`` (``containers()``) mounts."""
    tasks = Path(state_dir) / "docker-tasks"
    mounted = {str(m.get("Source")) for c in containers for m in c.get("Mounts") or []}
    for folder in tasks.glob(f"{LASTING}-*") if tasks.is_dir() else ():
        if str(folder) not in mounted and is_dead(folder_owner(folder.name)):
            shutil.rmtree(folder, ignore_errors=True)


def checkpoint_folder(plan: DockerPlan) -> None:
    """Make the task's checkpoint folder (a path root) on the worker, private to it, before the engine mounts it."""
    location = plan.request.checkpoint
    if location is None or location.is_uri or not plan.options.engine_is_local:
        return  # nothing on this worker to make (a remote engine's plan says why in its notes)
    location.make(plan.request.labels)


# Go's os.FileMode type bits, as the engine reports a path's stat: anything but a regular file.
_NOT_REGULAR = (1 << 31) | (1 << 27) | (1 << 26) | (1 << 25) | (1 << 24) | (1 << 21) | (1 << 19)


def read_result(client: Any, container_id: str) -> dict[str, Any] | None:
    """The runtime's result envelope from the stopped container, or ``None`` when it wrote none.

    :raises ResultError: when the container left something else there (a link, a FIFO, a folder) or too much
    """
    try:
        chunks, info = client.get_archive(container_id, RESULT_PATH)
    except NotFound:
        return None
    try:  # the engine streams the archive while the container is locked: always close the stream
        if int(info.get("mode", 0)) & _NOT_REGULAR:
            raise ResultError(f"{RESULT_PATH} in the container is not a regular file: it is ignored.")
        if int(info.get("size", 0)) > MAX_RESULT_BYTES:
            raise ResultError(f"The result file {RESULT_PATH} is larger than {MAX_RESULT_BYTES} bytes.")
        archive = io.BytesIO()
        for chunk in chunks:
            archive.write(chunk)
            if archive.tell() > MAX_RESULT_BYTES + 2**16:
                raise ResultError(f"The result file {RESULT_PATH} is larger than {MAX_RESULT_BYTES} bytes.")
    finally:
        chunks.close()
    archive.seek(0)
    with tarfile.open(fileobj=archive) as tar:
        member = tar.next()
        if member is None or not member.isreg() or member.size > MAX_RESULT_BYTES:
            raise ResultError(f"{RESULT_PATH} in the container is not a regular file of bounded size: it is ignored.")
        handle = tar.extractfile(member)
        assert handle is not None  # a regular file
        return dict(json.loads(handle.read()))
