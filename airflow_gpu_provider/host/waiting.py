"""Waiting for GPUs without holding them: which of the host's GPU locks are taken, seen from outside.

A task with ``on_missing_gpu="wait"`` and ``deferrable=True`` does not sleep in its worker: the allocator raises
:class:`MustWait`, the operator defers to :class:`~airflow_gpu_provider.host.trigger.GpuFreeTrigger`, and the trigger
asks :func:`free_count` until enough of the lock files are free, then the task starts again and allocates (racing
tasks allowed: a lost race defers again). The locks are ``flock`` s (``host/allocator.py``, ``host/shares.py``);
whether one is held, and how, is read from ``/proc/locks``, without taking it: a probe that took the lock, even for a
moment, could make another task's ``on_missing_gpu="fail"`` allocation fail. A share waits for one GPU whose
unpromised parts hold it (:func:`free_parts`).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_gpu_provider.exceptions import GpuUnavailableError
from airflow_gpu_provider.host.locks import free_count, held_now
from airflow_gpu_provider.host.shares import free_parts


@dataclass
class MustWait(Exception):
    """The GPUs are busy and the task defers its wait (``TaskRequest.defer_wait``).

    :param lock_files: the lock files of the devices that would do (host/allocator.py ``lock_path``)
    :param count: how many of them must be free
    :param requested: the request in words ("1x nvidia GPU")
    :param state: what the host has and who holds it, in words
    :param timeout: seconds the task may wait (``[gpu] wait_timeout`` or the task's)
    :param parts: a share's wait: the parts of each GPU of ``lock_files`` the share needs (one GPU must hold them)
    """

    lock_files: list[str]
    count: int
    requested: str
    state: str
    timeout: float
    parts: list[int] = field(default_factory=list)

    def __str__(self) -> str:
        return f"Requested {self.requested} but {self.state}"


def waited_too_long(requested: str, waited: float, limit: float, state: str) -> str:
    """The failure of a wait that reached its limit (``limit`` seconds), in words."""
    return (
        f"Waited {waited:.0f}s for {requested} (on_missing_gpu='wait') and reached the wait's limit of {limit:g}s "
        f"(the task's wait_timeout, else [gpu] wait_timeout): {state}. Raise wait_timeout, give the task fewer "
        "GPUs, or free the busy ones."
    )


def wait_for(
    attempt: Callable[[], Any],
    now: Callable[[], str],
    requested: str,
    *,
    poll: float,
    timeout: float,
    log: logging.Logger,
    sleep: Callable[[float], None],
) -> Any:
    """Wait in the worker (``on_missing_gpu="wait"``, not deferred) until ``attempt`` gives an ``Allocation``.

    It tries every ``poll`` seconds (jittered), logs what ``now`` says of the host every minute (then less often)
    and fails at ``timeout``.
    """
    waited, next_report = 0.0, 60.0
    while True:
        delay = min(poll * random.uniform(0.8, 1.2), max(timeout - waited, 0.01))
        sleep(delay)
        waited += delay
        allocation = attempt()
        if allocation is not None:
            log.info("Got GPUs %s after waiting %.0fs.", [d.id for d in allocation.devices], waited)
            return allocation
        if waited >= timeout:
            raise GpuUnavailableError(waited_too_long(requested, waited, timeout, now()))
        if waited >= next_report:
            log.info("Still waiting for %s after %.0fs: %s.", requested, waited, now())
            next_report *= 2


def ready(lock_files: Sequence[str], count: int, parts: Sequence[int] = ()) -> tuple[bool, int]:
    """Whether a wait is over, and how many GPUs would do now.

    Over when ``count`` of ``lock_files`` are free, or for a share (``parts``: what it needs of each GPU) when one
    GPU's unpromised parts hold it.
    """
    if not parts:
        free = free_count(lock_files)
        return free >= count, free
    held = held_now()
    fitting = sum(1 for path, need in zip(lock_files, parts, strict=False) if free_parts(Path(path), held) >= need)
    return fitting >= 1, fitting
