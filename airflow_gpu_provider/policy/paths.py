"""No path trusted by its name: host paths resolved one component at a time, without following a link.

A path is **stable** for this worker when nobody but root and the worker's own user can change what it names:
walked from ``/`` with ``openat(O_PATH | O_NOFOLLOW)``, no component is a symbolic link, and every directory on the
way is owned by root or the worker and writable by no one else, unless it is sticky (``/tmp``, ``/var/tmp``) and
the entry in it is root's or the worker's (in a sticky folder only an entry's owner may rename or remove it). A
stable path can be handed to Docker, which resolves the name again when the container starts: the name still
names the same thing. Anything else is refused, naming the component and why (rule F1: *no path is trusted by its
name*, docs/security.md).

Folders the provider makes are made the same way (``mkdirat`` beneath a stable folder, 0700), and a tree is
deleted only through descriptors, beneath a stable root, when it holds the marker the provider wrote (rule F2).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
from collections.abc import Iterator, Mapping
from pathlib import PurePosixPath

from airflow_gpu_provider.exceptions import GpuTaskError

_OPEN = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
MARKER = ".airflow-gpu-provider"  # written by the provider into a folder it made; checked before deleting it


class UnsafePathError(GpuTaskError):
    """A path that someone other than root and the worker could redirect, or that is not what it must be."""

    def __init__(self, path: str, problem: str) -> None:
        self.path, self.problem = path, problem
        super().__init__(f"Refusing {path}: {problem}")


def trusted(uid: int) -> bool:
    """Whether ``uid`` may change the folders a worker relies on: root, or the worker's own user."""
    return uid in (0, os.geteuid())


def components(path: str) -> list[str]:
    """The names of an absolute path, refused when it is relative or names ``.`` or ``..`` (never normalised away)."""
    if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
        raise UnsafePathError(repr(path), "not an absolute path")
    parts = [part for part in path.split("/") if part]
    if any(part in (".", "..") for part in parts):
        raise UnsafePathError(path, "it names '.' or '..': give the path itself")
    return parts


def local_path(root: str) -> str | None:
    """The local path a root names: a path as it is, a ``file://`` URI's path; ``None`` for an object store's URI.

    :raises UnsafePathError: for a ``file://`` URI of another host
    """
    if "://" not in root:
        return root
    scheme, _, rest = root.partition("://")
    if scheme.lower() != "file":
        return None
    host, _, path = rest.partition("/")
    if host not in ("", "localhost"):
        raise UnsafePathError(root, f"a file:// URI of another host ({host!r}) is no folder of this one")
    return "/" + path


def root_parts(root: str) -> tuple[str, ...]:
    """A path or URI root as the policy compares it, component by component, never as a string prefix.

    ``/data/ckpt`` and ``file:///data/ckpt`` are ``('/', 'data', 'ckpt')``; ``s3://bucket/ckpt`` is
    ``('s3://bucket', 'ckpt')`` (the scheme in lower case, the bucket and any ``conn_id@`` as written). A URI whose
    path names ``.`` or ``..``, has an empty or percent-encoded segment, a query or a fragment is refused: an object
    store or fsspec may read it as another folder than its name says.

    :raises UnsafePathError: naming what makes the root ambiguous
    """
    path = local_path(root)
    if path is None or path != root:  # a URI
        if any(mark in root for mark in "%?#\\"):
            raise UnsafePathError(root, "a URI root takes no percent-encoding, query, fragment or backslash")
        scheme, _, rest = root.partition("://")
        authority, _, tail = rest.partition("/")
        tail = tail.removesuffix("/")
        segments = tail.split("/") if tail else []
        if any(segment in ("", ".", "..") for segment in segments):
            raise UnsafePathError(root, "its path names '.', '..' or an empty segment: give the folder itself")
        return ("/" if path is not None else f"{scheme.lower()}://{authority}", *segments)
    return ("/", *components(path))


def canonical(path: str) -> str:
    """``path`` as the policy checks it and the engine gets it: ``//data/x/`` is ``/data/x`` (:func:`components`)."""
    return "/" + "/".join(components(path))


def _check_folder(where: str, info: os.stat_result) -> None:
    """A directory on the way: the worker's or root's, writable by no one else unless sticky."""
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafePathError(where, "a component on the way is not a directory")
    if not trusted(info.st_uid):
        raise UnsafePathError(where, f"it belongs to uid {info.st_uid}, who could swap what lies in it")
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        raise UnsafePathError(where, f"others may write to it (mode {stat.S_IMODE(info.st_mode):04o})")


def _entry(parent: int, name: str, where: str, parent_info: os.stat_result) -> tuple[int, os.stat_result]:
    """Open one entry of ``parent`` without following it; refuse a link, or a foreign entry of a sticky folder."""
    try:
        fd = os.open(name, _OPEN, dir_fd=parent)
    except FileNotFoundError:
        raise
    except OSError as err:
        raise UnsafePathError(where, f"cannot be opened safely ({err.strerror})") from None
    info = os.fstat(fd)
    if stat.S_ISLNK(info.st_mode):
        os.close(fd)
        raise UnsafePathError(where, "it is a symbolic link, which may point anywhere by the time it is used")
    if parent_info.st_mode & 0o022 and not trusted(info.st_uid):  # sticky and shared: the entry's owner rules it
        os.close(fd)
        raise UnsafePathError(where, f"it belongs to uid {info.st_uid} in a folder others may write to")
    return fd, info


@contextlib.contextmanager
def walk(path: str) -> Iterator[tuple[int, os.stat_result]]:
    """An ``O_PATH`` descriptor of a stable ``path`` and its ``stat``; closed on exit.

    :raises UnsafePathError: when a component is a link, or a folder on the way is not the worker's or root's, or
        others may write to it (see the module's docstring)
    :raises FileNotFoundError: when a component does not exist
    """
    fd = os.open("/", _OPEN)
    info = os.fstat(fd)
    where = "/"
    try:
        for name in components(path):
            _check_folder(where, info)
            child, info = _entry(fd, name, f"{where.rstrip('/')}/{name}", info)
            os.close(fd)
            fd, where = child, f"{where.rstrip('/')}/{name}"
        yield fd, info
    finally:
        os.close(fd)


def stable(path: str, *, directory: bool | None = None) -> os.stat_result:
    """Check that ``path`` is stable (and a directory, or not, when ``directory`` says); its ``stat``."""
    with walk(path) as (_, info):
        if directory is True and not stat.S_ISDIR(info.st_mode):
            raise UnsafePathError(path, "it is not a directory")
        if directory is False and not stat.S_ISREG(info.st_mode):
            raise UnsafePathError(path, "it is not a regular file")
        return info


def beneath(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or lies under it (by name: both are checked for links separately)."""
    return PurePosixPath(path) == PurePosixPath(root) or PurePosixPath(root) in PurePosixPath(path).parents


def make_private(path: str, *, mode: int = 0o700) -> str:
    """Make the folder ``path`` and its missing parents (``mode``, the worker's), beneath a stable existing folder.

    Existing components are checked as :func:`walk` checks them; a folder is created with ``mkdirat`` in a folder
    already checked, so no name on the way can be swapped meanwhile. The folder itself must be the worker's own and
    private (no group or other write bit).

    :return: ``path``
    """
    parts = components(path)
    fd = os.open("/", _OPEN)
    info, where = os.fstat(fd), "/"
    try:
        for name in parts:
            _check_folder(where, info)
            here = f"{where.rstrip('/')}/{name}"
            try:
                child, child_info = _entry(fd, name, here, info)
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):  # another worker made it meanwhile: checked below
                    os.mkdir(name, mode, dir_fd=fd)
                child, child_info = _entry(fd, name, here, info)
            os.close(fd)
            fd, info, where = child, child_info, here
        if info.st_uid != os.geteuid() or info.st_mode & 0o022 or not stat.S_ISDIR(info.st_mode):
            raise UnsafePathError(path, "it is not a private folder of the worker's own (0700)")
    finally:
        os.close(fd)
    return path


def write_marker(folder: str, identity: Mapping[str, str]) -> None:
    """Mark a folder the provider made, with what it is for (``identity``): what :func:`remove_marked` checks."""
    make_private(folder)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(f"{folder.rstrip('/')}/{MARKER}", flags, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(dict(identity), handle)


def _read_marker(folder_fd: int) -> dict[str, str] | None:
    try:
        fd = os.open(MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder_fd)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_size > 4096:
            return None
        try:
            value = json.loads(handle.read())
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def remove_marked(root: str, relative: str, identity: Mapping[str, str]) -> bool:
    """Delete ``root/relative`` when it is the provider's: stable, and marked with ``identity``; whether deleted.

    Only through descriptors: the folders on the way are opened without following links and checked, and the tree
    is removed by ``shutil.rmtree(name, dir_fd=parent)``, which never follows a link inside it.

    :raises UnsafePathError: when the root or a folder on the way could be redirected by someone else
    """
    names = [part for part in relative.split("/") if part]
    if not names or any(part in (".", "..") for part in names):
        raise UnsafePathError(relative, "not a folder beneath the root")
    try:
        with walk(root) as (fd, info):
            _check_folder(root, info)
            parent = os.dup(fd)
    except FileNotFoundError:
        return False
    where = root.rstrip("/")
    try:
        for name in names[:-1]:
            where = f"{where}/{name}"
            try:
                child, child_info = _entry(parent, name, where, os.fstat(parent))
            except FileNotFoundError:
                return False
            os.close(parent)
            parent = child
            _check_folder(where, child_info)
            if child_info.st_uid != os.geteuid():
                raise UnsafePathError(where, "it is not the worker's own folder")
        try:
            target = os.open(names[-1], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        except FileNotFoundError:
            return False
        except OSError as err:
            if err.errno in (errno.ELOOP, errno.ENOTDIR):
                raise UnsafePathError(f"{where}/{names[-1]}", "it is not a folder (a link?)") from None
            raise
        try:
            marker = _read_marker(target)
        finally:
            os.close(target)
        if marker is None or any(marker.get(key) != value for key, value in identity.items()):
            raise UnsafePathError(f"{where}/{names[-1]}", "it holds no marker of the provider for this run")
        shutil.rmtree(names[-1], dir_fd=parent)
        return True
    finally:
        os.close(parent)
