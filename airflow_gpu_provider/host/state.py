"""The host-wide state dir (``[gpu] state_dir``), trusted only when it is the worker's own.

Worker hosts are shared. The default lies in the home folder of the worker's user (``~/.local/state``), where no
other local user can make it first; a state dir an admin sets may lie in a shared folder (``/var/tmp``). A folder of
the state dir is used only when it is a real directory (not a symlink) owned by the worker's user and writable by
nobody else; the provider creates it private (0700). Files in it are opened without following symlinks and must be
regular files of the worker's own. So another user can neither plant a lock file that points at a file of the
worker's, nor a "cached" venv that the worker would run.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from airflow_gpu_provider.exceptions import GpuTaskError
from airflow_gpu_provider.host.workers import is_dead, worker_identity


class UntrustedStateError(GpuTaskError):
    """A folder or file of the state dir that the worker did not make, or that others may change."""


def _refuse(path: Path, what: str) -> UntrustedStateError:
    return UntrustedStateError(
        f"Refusing {path}: {what}. Another user of this host may have made it. Remove it, or set [gpu] state_dir to "
        "a folder of the worker's own (created 0700 when missing)."
    )


def check_owned(path: Path, info: os.stat_result, *, directory: bool) -> None:
    """Raise unless ``info`` (an ``lstat``/``fstat`` of ``path``) is the worker's own and writable by it alone."""
    kind = stat.S_ISDIR if directory else stat.S_ISREG
    if not kind(info.st_mode):
        expected = "a directory" if directory else "a regular file"
        raise _refuse(path, f"it is not {expected} (a symlink, a FIFO or a device?)")
    if info.st_uid != os.geteuid():
        raise _refuse(path, f"it belongs to uid {info.st_uid}, not to this worker (uid {os.geteuid()})")
    if info.st_mode & 0o022:
        raise _refuse(path, f"others may write to it (mode {stat.S_IMODE(info.st_mode):04o})")


def private_dir(path: str | os.PathLike[str]) -> Path:
    """The folder ``path``, created 0700 if missing (parents too), else checked: the worker's own, private to it.

    Its parent (the state dir, for the folders in it) must not let others rename or replace it: the worker's or
    root's, and writable by nobody else unless sticky (``/var/tmp``).
    """
    folder = Path(path)
    _make_private(folder.parent)
    parent = os.stat(folder.parent)
    if parent.st_uid not in (os.geteuid(), 0):
        raise _refuse(folder.parent, f"it belongs to uid {parent.st_uid}, who may replace {folder.name} in it")
    if parent.st_mode & 0o022 and not parent.st_mode & stat.S_ISVTX:
        mode = stat.S_IMODE(parent.st_mode)
        raise _refuse(folder.parent, f"others may write to it (mode {mode:04o}) and replace {folder.name} in it")
    _make_private(folder)
    check_owned(folder, os.lstat(folder), directory=True)
    return folder


def _make_private(folder: Path) -> None:
    """Create ``folder`` and its missing parents 0700."""
    if not os.path.lexists(folder):
        _make_private(folder.parent)
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)


def open_private(path: str | os.PathLike[str], flags: int = os.O_RDWR | os.O_CREAT) -> int:
    """Open a file of the state dir (created 0600), never through a symlink; it must be the worker's own."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError as err:
        if err.errno == errno.ELOOP:  # a symlink where the file should be
            raise _refuse(Path(path), "it is a symlink") from None
        raise
    try:
        check_owned(Path(path), os.fstat(fd), directory=False)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def exclusive(path: str | os.PathLike[str]) -> Iterator[float]:
    """Hold an exclusive ``flock`` on a lock file of the state dir; yield the seconds spent waiting for it.

    The file is removed when the holder is done, so lock files do not pile up: a waiter that got the lock on a file
    that was removed meanwhile retries on the new one.
    """
    lock = Path(path)
    private_dir(lock.parent)
    started = time.monotonic()
    while True:
        fd = open_private(lock)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            same = os.fstat(fd).st_ino == os.lstat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield time.monotonic() - started
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock)
        os.close(fd)


def left_by_dead_workers(parent: str | os.PathLike[str]) -> bool:
    """Whether a worker of this host died while a task of its ran: it left its task folder in ``parent``.

    A task process starts only once its folder holds its envelope, and the folder goes only after the task's last
    process has ended: where no dead worker's folder is left, no task process of a dead worker is (the local
    backend then skips its scan of every process's environment, ``reap_orphans``).
    """
    with contextlib.suppress(OSError):
        return any(is_dead(folder_owner(p.name)) for p in Path(parent).glob("task-*"))
    return False


def task_folder(parent: str | os.PathLike[str], *, prefix: str = "task") -> Path:
    """A new private folder for one task in ``parent`` (made private), named ``<prefix>-<its worker>-...``.

    The ``task-`` folders that workers of this host left when they were killed are removed first (a worker of another
    host or container sharing the state dir is never taken for dead); another prefix's are their owner's to remove.
    """
    folder = private_dir(parent)
    for stale in folder.glob("task-*"):
        if is_dead(folder_owner(stale.name)):
            shutil.rmtree(stale, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}-{worker_identity()}-", dir=folder))


def folder_owner(name: str) -> str:
    """The worker identity in a :func:`task_folder`'s name."""
    return name.split("-", 1)[-1].rsplit("-", 1)[0]


def runtime_file(state_dir: str | os.PathLike[str]) -> Path:
    """The archive as a file of the state dir, for the local backend: written once per digest, then reused.

    ``<state_dir>/runtime/runtime-<digest>-<python>.pyz``, compiled by this Python (``task/runtime_zip.py``
    ``compiled``): 0600 in a folder of the worker's own (0700), written atomically (a task never runs a half-written
    archive), and rewritten if its sources are not the archive's.

    :raises UntrustedStateError: when the folder or the file is not the worker's own
    """
    from airflow_gpu_provider.task.runtime_zip import compiled, digest, entries  # built when a local task first runs

    folder = private_dir(Path(state_dir) / "runtime")
    path = folder / f"runtime-{digest()[:16]}-{sys.implementation.cache_tag}.pyz"
    with contextlib.suppress(FileNotFoundError), os.fdopen(open_private(path, os.O_RDONLY), "rb") as handle:
        if handle.read().startswith(entries()):
            return path
    descriptor, temporary = tempfile.mkstemp(prefix=".runtime-", suffix=".tmp", dir=folder)  # 0600
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(compiled(str(path)))
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return path


def compiled_script(state_dir: str | os.PathLike[str], script: str | os.PathLike[str]) -> Path:
    """A standard-library script compiled once per host into the state dir: the interpreter runs the ``.pyc``.

    A script run as a file is compiled from its source at every start (the local backend's supervisor: milliseconds
    of CPU before each task). ``<state_dir>/runtime/<name>-<digest>-<python>.pyc``, compiled by this Python, 0600 in
    a folder of the worker's own, written atomically; its name holds its source's digest, so a changed script gets
    a file of its own.
    """
    import hashlib
    import importlib.util
    import marshal

    source = Path(script).read_bytes()
    folder = private_dir(Path(state_dir) / "runtime")
    name = Path(script).stem
    path = folder / f"{name}-{hashlib.sha256(source).hexdigest()[:16]}-{sys.implementation.cache_tag}.pyc"
    with contextlib.suppress(FileNotFoundError):
        os.close(open_private(path, os.O_RDONLY))  # there, and the worker's own (else refused)
        return path
    code = compile(source, str(script), "exec", dont_inherit=True)
    header = importlib.util.MAGIC_NUMBER + (0b01).to_bytes(4, "little") + importlib.util.source_hash(source)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{name}-", suffix=".tmp", dir=folder)  # 0600
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(header + marshal.dumps(code))  # an unchecked hash-based .pyc (PEP 552)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return path
