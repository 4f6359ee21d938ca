"""The files a task container shares with the worker at ``/airflow-gpu``: runtime and envelope in, result out.

The fast path is a fresh worker folder bind-mounted there (as ``DockerOperator``'s ``mount_tmp_dir``). Where the
engine cannot see the worker's files (a remote engine, a worker in a container), they are copied in before the
container starts and the result is copied out after it stops, through the Docker API (slower: each copy mounts the
container's file system).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CONTAINER_DIR = "/airflow-gpu"
COMMAND = ["python3", f"{CONTAINER_DIR}/bootstrap.py", f"{CONTAINER_DIR}/envelope.json", f"{CONTAINER_DIR}/result.json"]
RESULT = "result.json"


class TaskFiles:
    """A worker folder with the container's input files; removed on exit.

    The folder is writable by everyone, because the container may run as any user (``user=``, or the image's
    ``USER``), but it lies in a parent folder that others can pass through and not list, so nobody else can find it.

    :param files: file name -> content, placed in ``/airflow-gpu``
    :param parent: where the folder is created (``<state_dir>/docker-tasks``)
    """

    def __init__(self, files: Mapping[str, bytes], *, parent: str | os.PathLike[str]) -> None:
        self.files = dict(files)
        Path(parent).mkdir(parents=True, exist_ok=True)
        os.chmod(parent, 0o711)  # noqa: S103 - others may pass through, not list
        self.path = Path(tempfile.mkdtemp(prefix="task-", dir=parent))
        for name, data in self.files.items():
            (self.path / name).write_bytes(data)
        os.chmod(self.path, 0o777)  # noqa: S103 - unlisted parent; the container's user writes the result here
        self.mounted = True

    def __enter__(self) -> TaskFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    @property
    def mount(self) -> dict[str, Any]:
        """The bind mount, in the Docker API's form."""
        return {"Target": CONTAINER_DIR, "Source": str(self.path), "Type": "bind", "ReadOnly": False}

    def copy_in(self, client: Any, container_id: str) -> None:
        """Without the mount: unpack the files into the created container."""
        if self.mounted:
            return
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            folder = tarfile.TarInfo(CONTAINER_DIR.strip("/"))
            folder.type, folder.mode = tarfile.DIRTYPE, 0o1777
            tar.addfile(folder)
            for name, data in self.files.items():
                info = tarfile.TarInfo(f"{folder.name}/{name}")
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
        client.put_archive(container_id, "/", buffer.getvalue())

    def result(self, client: Any, container_id: str) -> dict[str, Any] | None:
        """The runtime's result envelope, or ``None`` when it wrote none."""
        if self.mounted:
            path = self.path / RESULT
            return json.loads(path.read_text()) if path.exists() else None
        from docker.errors import NotFound

        try:
            chunks, _stat = client.get_archive(container_id, f"{CONTAINER_DIR}/{RESULT}")
        except NotFound:
            return None
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            member = tar.extractfile(RESULT)
            return None if member is None else json.loads(member.read())
