"""What a host keeps between tasks, kept within ``[gpu] cache_size``: least recently used first, never one in use.

The local backend's cached virtualenvs and the derived images of a local Docker engine are entries of a cache
folder of the state dir, each with a use file ``<key>.use`` (0600, the worker's own: :mod:`.state`). A task holds a
shared ``flock`` on it from before it looks the entry up until it no longer needs it (its venv's processes have
ended, its container exists); its modification time is the entry's last use. When a new entry has been built, the
least recently used entries go until the cache fits again: each only under an exclusive, non-blocking lock, so an
entry a task holds or is building is never removed, and a task that was waiting for a removed entry's lock sees its
use file gone and looks again (then builds it anew). Each removal is one line of the log.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from airflow_gpu_provider.host.state import open_private, private_dir
from airflow_gpu_provider.settings.units import format_bytes

USE = ".use"


def use_file(folder: str | os.PathLike[str], key: str) -> Path:
    """The use file of entry ``key`` (a name of letters, digits, ``_``, ``.`` and ``-``)."""
    return Path(folder) / f"{key}{USE}"


def _open_current(path: Path, operation: int) -> int | None:
    """A descriptor of ``path`` holding ``operation``'s flock, on the file that is there now; ``None`` if busy."""
    while True:
        try:
            fd = open_private(path, os.O_RDWR | (os.O_CREAT if operation & fcntl.LOCK_SH else 0))
        except FileNotFoundError:
            return None  # (an exclusive lock is only ever taken on a use file that is there)
        try:
            fcntl.flock(fd, operation)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            if os.fstat(fd).st_ino == os.lstat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass  # removed while this one waited: its entry went with it
        os.close(fd)


@contextlib.contextmanager
def using(folder: str | os.PathLike[str], key: str, *, exists: Callable[[], bool] | None = None) -> Iterator[int]:
    """Hold entry ``key`` as in use (a shared flock on its use file) and mark it used now; yield the descriptor.

    Pass the descriptor on to the processes that use the entry: the lock lasts as long as any of them.

    :param exists: whether the entry is there: when the block fails and it is not (its build failed), the use file
        goes too, unless a task still holds it (a holder nested in this one leaves it to the outermost)
    """
    fd = _open_current(use_file(private_dir(folder), key), fcntl.LOCK_SH)
    assert fd is not None  # a blocking lock is never busy
    try:
        os.utime(fd)
        yield fd
    except BaseException:
        os.close(fd)
        fd = -1
        if exists is not None and not exists():
            drop(folder, key)
        raise
    finally:
        if fd >= 0:
            os.close(fd)


def evict(
    folder: str | os.PathLike[str],
    sizes: Mapping[str, int],
    limit: int,
    remove: Callable[[str], bool],
    *,
    what: str,
    log: logging.Logger,
    named: Callable[[str], str] = str,
) -> list[str]:
    """Remove entries, least recently used first, until their total fits ``limit`` (``0``: no limit).

    :param sizes: every entry of the cache (its key) and the bytes it takes
    :param remove: removes an entry (the caller holds its use file exclusively); ``False`` when it could not
    :param what: the entries in words, for the log ("cached virtualenv", "derived image")
    :param named: an entry's name in the log, from its key
    :return: the keys removed
    """
    for path in Path(folder).glob(f"*{USE}"):  # the use files of entries that are gone (a failed build)
        if path.name[: -len(USE)] not in sizes:
            drop(folder, path.name[: -len(USE)])
    total = sum(sizes.values())
    if not limit or total <= limit:
        return []
    removed = []
    for key in sorted(sizes, key=lambda name: _last_use(folder, name)):
        if total <= limit:
            break
        fd = _open_current(use_file(folder, key), fcntl.LOCK_EX | fcntl.LOCK_NB)
        if fd is None:
            continue  # a task uses it (or builds it) now
        try:
            idle = time.time() - os.fstat(fd).st_mtime
            if not remove(key):
                continue
            os.unlink(use_file(folder, key))
        finally:
            os.close(fd)
        total -= sizes[key]
        removed.append(key)
        log.info("Removed %s %s (%s, unused for %.0fs): the cache was over [gpu] cache_size=%s, least recently "
                 "used first", what, named(key), format_bytes(sizes[key]), idle, format_bytes(limit))  # fmt: skip
    return removed


def drop(folder: str | os.PathLike[str], key: str) -> None:
    """Remove the use file of an entry that is gone (a build that failed), unless a task holds it."""
    fd = _open_current(use_file(folder, key), fcntl.LOCK_EX | fcntl.LOCK_NB)
    if fd is not None:
        try:
            os.unlink(use_file(folder, key))
        finally:
            os.close(fd)


def _last_use(folder: str | os.PathLike[str], key: str) -> float:
    try:
        return os.lstat(use_file(folder, key)).st_mtime
    except FileNotFoundError:
        return 0.0  # never used since use files came: the first to go
