"""Shares of one GPU on a worker host: placed by memory, held by ``flock`` s, freed by the kernel when a holder dies.

A GPU is promised in :data:`~airflow_gpu_provider.settings.shares.SHARE_PARTS` parts, never more than it has. Three
kinds of file in the lock folder (``<state_dir>/locks``, private to the worker's user: ``host/state.py``) do it:

- ``<vendor>-<id>.lock``, the GPU's lock (``host/allocator.py``): a whole-GPU task holds it exclusively, each share
  of the GPU holds it shared. So a whole-GPU task never lands on a GPU with shares, nor a share on a GPU a whole task
  holds, and neither waits for the other (every attempt is non-blocking).
- ``<vendor>-<id>.share-<token>``, one per share: its parts and holder (JSON), locked exclusively by the holder for
  as long as it holds the share. A file nobody locks is a dead holder's: it promises nothing, and the next placement
  on that GPU removes it. It is written under a temporary name and renamed when locked, so no reader sees it unheld.
- ``<vendor>-<id>.place``, held exclusively for the few milliseconds one placement (or the release of the last
  share) takes on that GPU: two placements never both take its last free parts.

Every lock is a ``flock``: the kernel drops it when the last descriptor of its open file closes. A share's
descriptors go to the task process (or a container's keeper) as a whole GPU's do, so a share is held while either
the worker or the task lives, and a SIGKILLed pair frees it by itself; there is no ledger to repair. What is
promised is counted, not what the GPU's memory holds now: processes outside the provider are not seen.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from airflow_gpu_provider.host.locks import Held as HeldLocks
from airflow_gpu_provider.host.locks import held_now, kinds
from airflow_gpu_provider.host.state import open_private
from airflow_gpu_provider.settings.shares import SHARE_PARTS, GpuShare

SHARE_INFIX, PLACE_SUFFIX = ".share-", ".place"


@dataclass(frozen=True)
class Claim:
    """What one share holds of a GPU: its parts, its memory (bytes, when known) and who holds it."""

    parts: int
    memory: int | None
    holder: str
    pid: int
    since: float

    @classmethod
    def read(cls, fd: int) -> Claim | None:
        """The claim a share file holds (``None``: not one the provider wrote)."""
        try:
            info = json.loads(os.pread(fd, 4096, 0))
        except ValueError:
            return None
        parts, memory = info.get("parts") if isinstance(info, dict) else None, info.get("memory")
        if not isinstance(parts, int) or isinstance(parts, bool) or not 0 < parts <= SHARE_PARTS:
            return None
        memory = memory if isinstance(memory, int) and not isinstance(memory, bool) else None
        since = info.get("since") if isinstance(info.get("since"), (int, float)) else 0.0
        pid = info.get("pid") if isinstance(info.get("pid"), int) else 0
        return cls(parts, memory, str(info.get("holder", "an unknown task"))[:300], pid, float(since))


def share_files(lock: Path) -> list[Path]:
    """The share files of the GPU whose lock is ``lock`` (held or left by dead holders)."""
    prefix = lock.name.removesuffix(".lock") + SHARE_INFIX
    with contextlib.suppress(FileNotFoundError):
        return sorted(p for p in lock.parent.iterdir() if p.name.startswith(prefix))
    return []


def live_claims(lock: Path, *, remove_stale: bool = False) -> list[Claim]:
    """The shares of a GPU that are held now, read from their files.

    A file that a shared lock can be taken on is held by nobody: a dead holder's (``remove_stale``: removed; only
    under the GPU's placement lock, where no share is being written).
    """
    if remove_stale:  # a share file half-written by a placement that was killed (it never became a share)
        for path in lock.parent.glob(f".{lock.name}.new-*"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    claims = []
    for path in share_files(lock):
        try:
            fd = open_private(path, os.O_RDONLY)
        except FileNotFoundError:
            continue  # released meanwhile
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                claim = Claim.read(fd)
                claims += [claim] if claim is not None else []
                continue
            if remove_stale:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        finally:
            os.close(fd)
    return claims


def holders(lock: Path) -> str | None:
    """Who holds shares of a GPU, in words (``None``: nobody)."""
    from airflow_gpu_provider.host.workers import describe_holder

    held = [f"{describe_holder(c.__dict__)}: {c.parts * 100 / SHARE_PARTS:.0f} %" for c in live_claims(lock)]
    return f"{len(held)} share(s): {'; '.join(held)}" if held else None


@contextlib.contextmanager
def placing(lock: Path) -> Iterator[None]:
    """Hold the GPU's placement lock (``<vendor>-<id>.place``): one placement or last release at a time."""
    fd = open_private(lock.with_suffix(PLACE_SUFFIX))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # the lock goes with it


class GpuDaemon(NamedTuple):
    """What a GPU with shares needs running (its MPS daemon): started with its first share, stopped after its last."""

    start: Callable[[], None]
    stop: Callable[[], None]


@dataclass
class Held:
    """A share held: the GPU's lock (shared) and the share's file (exclusive); :meth:`release` gives both back.

    :param on_last: called (under the placement lock) when this was the GPU's last share: an MPS daemon stops
    """

    lock: Path
    path: Path
    claim: Claim
    fds: list[int]
    on_last: Callable[[], None] | None = None

    def release(self) -> None:
        """Close the share's descriptors (idempotent); after the GPU's last share, ``on_last`` runs.

        The share's file goes with them, unless another process still holds it (a container's keeper).
        """
        if not self.fds:
            return
        with placing(self.lock):
            os.close(self.fds.pop())  # the share's file: removed below once nobody holds it
            if not live_claims(self.lock, remove_stale=True) and self.on_last is not None:
                self.on_last()
        while self.fds:
            os.close(self.fds.pop())


def place(
    lock: Path,
    share: GpuShare,
    memory_total: int | None,
    holder: str,
    *,
    daemon: GpuDaemon | None = None,
) -> Held | None:
    """Take ``share`` of the GPU whose lock is ``lock`` if its unpromised parts hold it, else ``None`` (at once).

    :param memory_total: the GPU's memory in bytes (``None``: unknown; only a fraction can be placed then)
    :param daemon: started under the placement lock when the share is the GPU's only one, stopped after the last
    """
    parts = share.parts_on(memory_total)
    if parts is None:
        return None
    gpu_fd = open_private(lock)
    try:
        fcntl.flock(gpu_fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:  # a whole-GPU task holds it
        os.close(gpu_fd)
        return None
    try:
        with placing(lock):
            live = live_claims(lock, remove_stale=True)
            if sum(claim.parts for claim in live) + parts > SHARE_PARTS:
                os.close(gpu_fd)
                return None
            claim = Claim(parts, share.memory_on(memory_total), holder, os.getpid(), time.time())
            path, share_fd = _write(lock, claim)
            held = Held(lock, path, claim, [gpu_fd, share_fd], None if daemon is None else daemon.stop)
            if not live and daemon is not None:
                try:
                    daemon.start()
                except BaseException:
                    held.fds.remove(gpu_fd)  # closed below
                    os.close(share_fd)
                    raise
            return held
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(gpu_fd)
        raise


def _write(lock: Path, claim: Claim) -> tuple[Path, int]:
    """The share's file, locked and written under a temporary name, then renamed (under the placement lock)."""
    token = secrets.token_hex(8)
    temporary = lock.parent / f".{lock.name}.new-{token}"
    fd = open_private(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.pwrite(fd, json.dumps(claim.__dict__).encode(), 0)
        path = lock.parent / f"{lock.name.removesuffix('.lock')}{SHARE_INFIX}{token}"
        os.rename(temporary, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    return path, fd


def free_parts(lock: Path, held: HeldLocks | None = None) -> int:
    """The parts of a GPU no share holds now; ``0`` while a whole-GPU task holds it.

    Read from ``/proc/locks`` (``held``: as read already) and the held share files, taking no lock.
    """
    held = held_now() if held is None else held
    if "WRITE" in (kinds(lock, held) or ()):
        return 0
    promised = 0
    for path in share_files(lock):
        if not kinds(path, held):
            continue  # a dead holder's
        with contextlib.suppress(FileNotFoundError):
            fd = open_private(path, os.O_RDONLY)
            try:
                claim = Claim.read(fd)
            finally:
                os.close(fd)
            promised += claim.parts if claim is not None else 0
    return max(0, SHARE_PARTS - promised)


def place_best(
    gpus: Sequence[tuple[Path, int | None]],
    share: GpuShare,
    holder: str,
    daemon: Callable[[int], GpuDaemon | None] | None = None,
) -> tuple[int, Held] | None:
    """``share`` of the fullest GPU of ``gpus`` (lock, memory in bytes) whose unpromised parts still hold it.

    Shares gather on few GPUs, and whole GPUs stay free for whole-GPU tasks. Returns the GPU's index and the share.

    :param daemon: the daemon of a GPU (by its index) that its shares need (:func:`place`)
    """
    held = held_now()
    fits = []
    for index, (lock, total) in enumerate(gpus):
        need = share.parts_on(total)
        if need is not None and (spare := free_parts(lock, held) - need) >= 0:
            fits.append((spare, index))
    for _, index in sorted(fits):
        needs = None if daemon is None else daemon(index)
        taken = place(gpus[index][0], share, gpus[index][1], holder, daemon=needs)
        if taken is not None:
            return index, taken
    return None
