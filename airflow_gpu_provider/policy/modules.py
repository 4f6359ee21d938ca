"""What of a DAG bundle a task ships with its function: the modules it names, read without following a link.

Rule F4 (docs/security.md): ``modules=["plmod", "mypkg"]`` ships ``plmod.py`` and the package folder ``mypkg/``
from the DAG's folder into the task's container or pod. A DAG author names them, and the worker reads them with
its own rights, so nothing may lead out of the bundle: no component is a symbolic link (the module, a folder or a
file in it), only regular files and folders are read, each opened with ``O_NOFOLLOW`` beneath a descriptor of the
folder above it, so a name swapped for a link between the check and the read is refused too. The folders searched
are the DAG bundle's own (``task/modules.py``); names are plain identifiers, so no ``..`` or ``/`` can appear.
``__pycache__``, ``*.pyc`` and hidden entries are left out; the whole is bounded (:data:`MAX_BYTES`,
:data:`MAX_FILES`), so a module cannot carry a data set into the envelope.
"""

from __future__ import annotations

import os
import stat

from airflow_gpu_provider.policy.paths import UnsafePathError

MAX_BYTES = 256 * 1024  # what a task's modules may take in all, before compression
MAX_FILES = 512
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class TooLargeError(ValueError):
    """The modules take more than :data:`MAX_BYTES` or :data:`MAX_FILES`."""


class Budget:
    """What a task's modules take so far, in bytes and files."""

    def __init__(self) -> None:
        self.size, self.files = 0, 0

    def add(self, size: int, where: str) -> None:
        """Count one file of ``size`` bytes (at ``where``, for the error); raise past the bound."""
        self.size, self.files = self.size + size, self.files + 1
        if self.size > MAX_BYTES or self.files > MAX_FILES:
            raise TooLargeError(f"they take more than {MAX_BYTES // 1024} KiB or {MAX_FILES} files (at {where})")


def _link_refused(where: str) -> UnsafePathError:
    return UnsafePathError(where, "it is a symbolic link: links are not followed, they could lead out of the bundle")


def _file(parent: int, name: str, where: str, budget: Budget, *, read: bool) -> bytes:
    try:
        fd = os.open(name, _FILE, dir_fd=parent)
    except OSError as err:
        if stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
            raise _link_refused(where) from None
        raise UnsafePathError(where, f"cannot be read ({err.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafePathError(where, "it is not a regular file")
        budget.add(info.st_size, where)
        return handle.read(MAX_BYTES + 1) if read else b""


def _tree(parent: int, name: str, where: str, prefix: str, budget: Budget, *, read: bool) -> dict[str, bytes]:
    try:
        fd = os.open(name, _DIR, dir_fd=parent)
    except OSError:
        raise _link_refused(where) from None  # it was a folder a moment ago: now a link
    files: dict[str, bytes] = {}
    try:
        for entry in sorted(os.scandir(fd), key=lambda entry: entry.name):
            if entry.name.startswith(".") or entry.name == "__pycache__" or entry.name.endswith(".pyc"):
                continue
            here, path = f"{where}/{entry.name}", f"{prefix}/{entry.name}"
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                raise _link_refused(here)
            if stat.S_ISDIR(mode):
                files.update(_tree(fd, entry.name, here, path, budget, read=read))
            elif stat.S_ISREG(mode):  # never opened otherwise: a FIFO would block, a device could act
                files[path] = _file(fd, entry.name, here, budget, read=read)
            else:
                raise UnsafePathError(here, "it is not a regular file")
    finally:
        os.close(fd)
    return files


def module_files(folder: str, name: str, budget: Budget, *, read: bool = True) -> dict[str, bytes] | None:
    """The files of module ``name`` in ``folder``, by path relative to it; ``None`` when it is not there.

    A package (``name/`` with ``__init__.py``) comes before a module file (``name.py``), which comes before a
    namespace package (a ``name/`` folder without one), as Python's import finds them.

    :param budget: what the task's modules took so far (one :class:`Budget` for all of them)
    :param read: read the files (on the worker); ``False`` checks names, links and sizes only (at DAG parse)
    :raises UnsafePathError: for a link or anything but a regular file or folder
    :raises TooLargeError: past :data:`MAX_BYTES` or :data:`MAX_FILES`, the task's modules together
    """
    top = os.open(os.path.realpath(folder), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the bundle, as named
    try:
        kinds = {}
        for entry in (name, f"{name}.py"):
            try:
                kinds[entry] = os.stat(entry, dir_fd=top, follow_symlinks=False).st_mode
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(kinds[entry]):
                raise _link_refused(f"{folder}/{entry}")
        package = name in kinds and stat.S_ISDIR(kinds[name])
        if package and (f"{name}.py" not in kinds or _has_init(top, name)):
            return _tree(top, name, f"{folder}/{name}", name, budget, read=read)
        if f"{name}.py" in kinds and stat.S_ISREG(kinds[f"{name}.py"]):
            return {f"{name}.py": _file(top, f"{name}.py", f"{folder}/{name}.py", budget, read=read)}
        if kinds:
            entry = name if name in kinds else f"{name}.py"
            raise UnsafePathError(f"{folder}/{entry}", "it is neither a folder nor a regular file")
        return None
    finally:
        os.close(top)


def _has_init(top: int, name: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(f"{name}/__init__.py", dir_fd=top, follow_symlinks=False).st_mode)
    except OSError:
        return False
