"""The host's ``flock`` s seen from outside, in ``/proc/locks``: which lock files are held, shared or exclusive.

Read without taking any lock: a probe that took a GPU's lock, even for a moment, could make another task's
``on_missing_gpu="fail"`` allocation fail. The trigger of a task waiting for GPUs, and the placement of shares
(``host/shares.py``), look here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

PROC_LOCKS = "/proc/locks"
Held = dict[tuple[int, int, int], set[str]]


def _held_inodes(text: str) -> Held:
    """Every file with an ``flock`` in ``/proc/locks``'s text, ``(major, minor, inode)``, with its kinds.

    The kinds: ``READ`` (shared) and ``WRITE`` (exclusive).
    """
    held: Held = {}
    for line in text.splitlines():
        fields = line.split()
        if "->" in fields:  # a waiter, not a holder
            continue
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        try:
            major, minor, inode = fields[5].split(":")
            held.setdefault((int(major, 16), int(minor, 16), int(inode)), set()).add(fields[3])
        except ValueError:
            continue
    return held


def held_now() -> Held:
    """The files with an ``flock`` now, and their kinds."""
    with open(PROC_LOCKS, encoding="ascii", errors="replace") as handle:
        return _held_inodes(handle.read())


def kinds(path: str | os.PathLike[str], held: Held) -> set[str] | None:
    """The kinds of ``flock`` on ``path`` (empty: none), ``None`` when it does not exist."""
    try:
        info = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return held.get((os.major(info.st_dev), os.minor(info.st_dev), info.st_ino), set())


def free_count(lock_files: Sequence[str]) -> int:
    """How many of ``lock_files`` nobody holds now, whole or shared (a missing lock file: a device never taken)."""
    held = held_now()
    return sum(1 for path in lock_files if not kinds(path, held))
