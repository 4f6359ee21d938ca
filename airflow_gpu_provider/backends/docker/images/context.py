"""The tar archives a derived image's build sends to the engine: its build context, and the install container's files.

Every worker file goes in after the policy layer checked it once more, right before it is read (the file may have
changed since the task's spec was made: ``policy/build.py``); a folder goes in flat, its regular files only. The
index credentials go in from memory, only into the install container's archive, never into a build context.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from airflow_gpu_provider.backends.docker.images.dockerfile import DerivedImageSpec, build_input
from airflow_gpu_provider.backends.docker.images.recipe import BUILD_DIR, DEPS, DEPS_DIR
from airflow_gpu_provider.task import runtime_zip


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def _add_folder(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, mode
    tar.addfile(info)


def _add_inputs(tar: tarfile.TarFile, spec: DerivedImageSpec, files: Iterable[tuple[str, str]], prefix: str) -> None:
    """The worker files, each checked again by the policy layer right before it is read."""
    for name, path in files:
        names = build_input(name, path, spec.policy)
        if names is None:
            tar.add(path, arcname=f"{prefix}{name}", recursive=False)
            continue
        _add_folder(tar, f"{prefix}{name}")
        for entry in names:
            tar.add(str(Path(path, entry)), arcname=f"{prefix}{name}/{entry}", recursive=False)


def build_context(spec: DerivedImageSpec, dockerfile: str, handle: IO[bytes], deps: IO[bytes] | None = None) -> None:
    """Write the build context (Dockerfile, uv, CA bundle, wheel folders, installed files) as a tar into ``handle``.

    :param deps: a tar of the install container's :data:`DEPS_DIR` (``get_archive``), copied in as ``deps``
    """
    with tarfile.open(fileobj=handle, mode="w") as tar:
        _add_bytes(tar, "Dockerfile", dockerfile.encode())
        if spec.uv_binary and not spec.install:
            tar.add(spec.uv_binary, arcname="uv", recursive=False)
        _add_inputs(tar, spec, spec.files, "")
        if spec.install:
            _add_folder(tar, DEPS)
        if deps is not None:
            with tarfile.open(fileobj=deps, mode="r|") as installed:
                root = Path(DEPS_DIR).name  # get_archive names the folder's entries under its base name
                for member in installed:
                    if member.name == root or not member.name.startswith(f"{root}/"):
                        continue
                    member.name = f"{DEPS}/{member.name[len(root) + 1 :]}"
                    if member.islnk():
                        member.linkname = f"{DEPS}/{member.linkname[len(root) + 1 :]}"
                    tar.addfile(member, installed.extractfile(member) if member.isreg() else None)
    handle.seek(0)


def install_files(spec: DerivedImageSpec) -> bytes:
    """The install container's files, for ``put_archive`` at ``/``: the runtime, uv, the netrc, CA bundle, wheels."""
    data = io.BytesIO()
    prefix = BUILD_DIR.strip("/") + "/"
    with tarfile.open(fileobj=data, mode="w") as tar:
        _add_folder(tar, prefix.rstrip("/"))
        _add_bytes(tar, prefix + runtime_zip.FILE_NAME, runtime_zip.archive())
        if spec.uv_binary:
            tar.add(spec.uv_binary, arcname=prefix + "uv", recursive=False)
        _add_bytes(tar, prefix + "netrc", spec.netrc.encode(), 0o600)  # from memory, never a file on the worker
        _add_inputs(tar, spec, spec.install_files, prefix)
    return data.getvalue()


def chunk_reader(chunks: Iterable[bytes]) -> IO[bytes]:
    """A file object over a stream of byte chunks (``get_archive``), for ``tarfile`` in stream mode."""
    return io.BufferedReader(_ChunkReader(iter(chunks)))


class _ChunkReader(io.RawIOBase):
    def __init__(self, chunks: Any) -> None:
        self._chunks, self._pending = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            try:
                self._pending = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(buffer), len(self._pending))
        buffer[:size], self._pending = self._pending[:size], self._pending[size:]
        return size
