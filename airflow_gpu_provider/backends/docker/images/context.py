"""The tar archives a derived image's containers get (``put_archive``): the worker's files, and what was installed.

Every worker file goes in after the policy layer checked it once more, right before it is read (the file may have
changed since the task's spec was made: ``policy/build.py``); a folder goes in flat, its regular files only. The
index credentials go in from memory, only into the credentialed install container, never into a committed one.
Archives are written to a temporary file: a wheel folder may hold gigabytes.
"""

from __future__ import annotations

import io
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from airflow_gpu_provider.backends.docker.images.recipe import BUILD_DIR, CA_PATH, DEPS_DIR, SHARE, UV_PATH
from airflow_gpu_provider.backends.docker.images.spec import DerivedImageSpec, build_input
from airflow_gpu_provider.task import runtime_zip

CA_NAME = CA_PATH.rsplit("/", 1)[1]


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def _add_folder(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, mode
    tar.addfile(info)


def _owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _add_inputs(tar: tarfile.TarFile, spec: DerivedImageSpec, files: Iterable[tuple[str, str]], where: str) -> None:
    """The worker files in the folder ``where`` (the CA bundle, :data:`CA_PATH` in an image), each checked again."""
    for name, path in files:
        target = f"{where.strip('/')}/{name}"
        names = build_input(name, path, spec.policy)
        if names is None:
            tar.add(path, arcname=target, recursive=False, filter=_owned_by_root)
            continue
        _add_folder(tar, target)
        for entry in names:
            tar.add(str(Path(path, entry)), arcname=f"{target}/{entry}", recursive=False, filter=_owned_by_root)


def _archive() -> tuple[IO[bytes], tarfile.TarFile]:
    handle = tempfile.TemporaryFile(prefix="airflow-gpu-context-")  # noqa: SIM115 - the caller closes it
    return handle, tarfile.open(fileobj=handle, mode="w")


def image_files(spec: DerivedImageSpec) -> IO[bytes]:
    """What an install container without credentials gets, to keep in the image: uv, the CA bundle, wheel folders."""
    handle, tar = _archive()
    with tar:
        _add_folder(tar, SHARE.lstrip("/"))
        if spec.uv_binary:
            tar.add(spec.uv_binary, arcname=UV_PATH.lstrip("/"), recursive=False, filter=_owned_by_root)
        _add_inputs(tar, spec, spec.files, SHARE)
    handle.seek(0)
    return handle


def install_files(spec: DerivedImageSpec) -> IO[bytes]:
    """The credentialed install container's files in :data:`BUILD_DIR`: runtime, uv, netrc, CA bundle, wheels."""
    handle, tar = _archive()
    with tar:
        _add_folder(tar, BUILD_DIR.strip("/"))
        _add_bytes(tar, f"{BUILD_DIR.strip('/')}/{runtime_zip.FILE_NAME}", runtime_zip.archive())
        if spec.uv_binary:
            tar.add(spec.uv_binary, arcname=f"{BUILD_DIR.strip('/')}/uv", recursive=False, filter=_owned_by_root)
        _add_bytes(tar, f"{BUILD_DIR.strip('/')}/netrc", spec.netrc.encode(), 0o600)  # from memory, never a file
        _add_inputs(tar, spec, spec.files, BUILD_DIR)
    handle.seek(0)
    return handle


def installed_files(spec: DerivedImageSpec, chunks: Iterable[bytes] | None) -> IO[bytes]:
    """What the image container gets after a credentialed install: :data:`DEPS_DIR`, and the CA bundle.

    :param chunks: ``get_archive``'s stream of :data:`DEPS_DIR` (its entries named under the folder's base name);
        ``None`` when nothing was installed
    """
    handle, tar = _archive()
    root = Path(DEPS_DIR).name
    with tar, tarfile.open(fileobj=chunk_reader(chunks or [_EMPTY]), mode="r|") as installed:
        for member in installed:
            if member.name != root and not member.name.startswith(f"{root}/"):
                continue
            member.name = DEPS_DIR.lstrip("/") + member.name[len(root) :]
            if member.islnk():
                member.linkname = DEPS_DIR.lstrip("/") + member.linkname[len(root) :]
            tar.addfile(member, installed.extractfile(member) if member.isreg() else None)
        _add_inputs(tar, spec, [(n, p) for n, p in spec.files if n == CA_NAME], SHARE)
    handle.seek(0)
    return handle


_EMPTY = b"\0" * 1024  # an empty tar archive: its two end blocks


def chunk_reader(chunks: Iterable[bytes]) -> IO[bytes]:
    """A file object over a stream of byte chunks (``get_archive``), for ``tarfile`` in stream mode."""
    return io.BufferedReader(_ChunkReader(iter(chunks)))


class _ChunkReader(io.RawIOBase):
    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks, self._pending = iter(chunks), b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._pending:
            try:
                self._pending = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(buffer), len(self._pending))
        buffer[:size], self._pending = self._pending[:size], self._pending[size:]
        return size
