"""Waiting for GPUs without holding them: which of the host's GPU locks are taken, seen from outside.

A task with ``on_missing_gpu="wait"`` and ``deferrable=True`` does not sleep in its worker: the allocator raises
:class:`MustWait`, the operator defers to :class:`~airflow_gpu_provider.host.trigger.GpuFreeTrigger`, and the trigger
asks :func:`free_count` until enough of the lock files are free, then the task starts again and allocates (racing
tasks allowed: a lost race defers again). The locks are ``flock`` s (``host/allocator.py``); whether one is held is
read from ``/proc/locks``, without taking it: a probe that took the lock, even for a moment, could make another
task's ``on_missing_gpu="fail"`` allocation fail.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

PROC_LOCKS = "/proc/locks"


@dataclass
class MustWait(Exception):
    """The GPUs are busy and the task defers its wait (``TaskRequest.defer_wait``).

    :param lock_files: the lock files of the devices that would do (host/allocator.py ``lock_path``)
    :param count: how many of them must be free
    :param requested: the request in words ("1x nvidia GPU")
    :param state: what the host has and who holds it, in words
    :param timeout: seconds the task may wait (``[gpu] wait_timeout`` or the task's)
    """

    lock_files: list[str]
    count: int
    requested: str
    state: str
    timeout: float

    def __str__(self) -> str:
        return f"Requested {self.requested} but {self.state}"


def waited_too_long(requested: str, waited: float, limit: float, state: str) -> str:
    """The failure of a wait that reached its limit (``limit`` seconds), in words."""
    return (
        f"Waited {waited:.0f}s for {requested} (on_missing_gpu='wait') and reached the wait's limit of {limit:g}s "
        f"(the task's wait_timeout, else [gpu] wait_timeout): {state}. Raise wait_timeout, give the task fewer "
        "GPUs, or free the busy ones."
    )


def _held_inodes(text: str) -> set[tuple[int, int, int]]:
    """``(major, minor, inode)`` of every file with an ``flock`` in ``/proc/locks``'s text."""
    held = set()
    for line in text.splitlines():
        fields = line.split()
        if "->" in fields:  # a waiter, not a holder
            continue
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        try:
            major, minor, inode = fields[5].split(":")
            held.add((int(major, 16), int(minor, 16), int(inode)))
        except ValueError:
            continue
    return held


def free_count(lock_files: Sequence[str]) -> int:
    """How many of ``lock_files`` nobody holds now (a missing lock file: a device never taken)."""
    with open(PROC_LOCKS, encoding="ascii", errors="replace") as handle:
        held = _held_inodes(handle.read())
    free = 0
    for path in lock_files:
        try:
            info = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            free += 1
            continue
        if (os.major(info.st_dev), os.minor(info.st_dev), info.st_ino) not in held:
            free += 1
    return free
