"""The files a task container gets from the worker (the runtime and the envelope) and the one it gives back.

Inputs: a fresh folder, mounted **read-only** at ``/airflow-gpu``. It lies in the worker's private state dir (0700),
so no other user of the host can reach it, read the envelope or plant a module there; being read-only, nothing the
container writes (a setuid binary, a symlink) ever lands in a host path. Where the engine cannot see the worker's
files (a remote engine, a worker in a container), the inputs are copied in through the Docker API instead.

The task's checkpoint folder (a path root) is the one folder the container may write to on the worker: private
to the worker like the inputs, bind-mounted read-write, with the container running as the worker's user.

Output: the runtime writes its result envelope inside the container (``/tmp``), and the worker reads it through
the Docker API after the container stopped: a regular file, of bounded size, whatever the container left there.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from collections.abc import Mapping
from typing import Any

from docker.errors import NotFound

from airflow_gpu_provider.backends.docker.plan import CONTAINER_DIR, RESULT_PATH, DockerPlan
from airflow_gpu_provider.host.state import task_folder
from airflow_gpu_provider.task.result import MAX_RESULT_BYTES, ResultError
from airflow_gpu_provider.task.runtime_zip import FILE_NAME
from airflow_gpu_provider.task.runtime_zip import archive as runtime_archive


class TaskFiles:
    """The container's inputs in a fresh folder of the worker's private state dir; removed on exit.

    :param files: file name -> content, placed in ``/airflow-gpu``
    :param parent: where the folder is created (``<state_dir>/docker-tasks``, private to the worker)
    """

    def __init__(self, files: Mapping[str, bytes], *, parent: str | os.PathLike[str]) -> None:
        self.files = dict(files)
        self.path = task_folder(parent)
        for name, data in self.files.items():
            (self.path / name).write_bytes(data)
            (self.path / name).chmod(0o644)
        # Readable by the container's user, whoever that is; others cannot reach it through the private parent.
        self.path.chmod(0o755)
        self.mounted = True

    def __enter__(self) -> TaskFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    @property
    def mount(self) -> dict[str, Any]:
        """The read-only bind mount, in the Docker API's form."""
        return {"Target": CONTAINER_DIR, "Source": str(self.path), "Type": "bind", "ReadOnly": True}

    def archive(self) -> bytes:
        """The files as a tar of ``/airflow-gpu``, the worker's own (what the container's user could write).

        The runtime goes as its plain archive, not precompiled: 240 KB smaller, so that more of the 1 MiB an engine's
        authorization plugin sees of an upload (``policy/authz/archive.py``) is left to the envelope.
        """
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
        """Without the mount: unpack the files into the created container (:func:`upload`)."""
        if not self.mounted:
            upload(client, container_id, "/", self.archive())


def _owned(member: tarfile.TarInfo) -> tarfile.TarInfo:
    member.uid, member.gid = os.geteuid(), os.getegid()  # what the container's own user could have written
    return member


def upload(client: Any, container_id: str, path: str, archive: bytes) -> None:
    """``put_archive``, labelled ``application/json`` so that an engine's authorization plugin sees the archive.

    The engine unpacks an upload as root, into the container's mounts too (the checkpoint folder is one); it shows
    a plugin only JSON bodies, and the provider's plugin refuses an upload it cannot see into a container with a
    writable host folder (``policy/authz/archive.py``). The engine reads the body as a tar whatever its label.
    """
    url = client._url("/containers/{0}/archive", container_id)
    response = client._put(url, params={"path": path}, data=archive, headers={"Content-Type": "application/json"})
    client._raise_for_status(response)


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
