"""GPUs of this host left out for a while after a try failed on them because of the GPU itself (an Xid, ECC).

The local and Docker backends quarantine the devices of a try whose failure names them (``failure["gpus"]``, the
runtime's ``failures.py``) for ``[gpu] quarantine_seconds``; :meth:`~.allocator.HostGpus.allocate` skips them
until then, and says so. The list is one JSON file of the state dir (``quarantine/gpus.json``): the worker's own,
0600 in a 0700 folder, never read or written through a link (:mod:`.state`), replaced atomically under a lock.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow_gpu_provider.exceptions import GpuInfrastructureError
from airflow_gpu_provider.host.inventory import Device
from airflow_gpu_provider.host.state import exclusive, open_private, private_dir

MAX_ENTRIES = 256  # far more GPUs than a host has: the rest is not a quarantine list


def _file(state_dir: str | os.PathLike[str]) -> Path:
    return Path(state_dir) / "quarantine" / "gpus.json"


def quarantined(state_dir: str | os.PathLike[str], now: float | None = None) -> dict[str, dict[str, Any]]:
    """The devices quarantined now: device id -> ``{"until": epoch seconds, "reason": ...}``."""
    path, now = _file(state_dir), time.time() if now is None else now
    private_dir(path.parent)
    try:
        with os.fdopen(open_private(path, os.O_RDONLY), "rb") as handle:
            entries = json.loads(handle.read(1 << 20) or b"{}")
    except FileNotFoundError:
        return {}
    except ValueError:
        return {}  # a half-written file cannot be: it is replaced atomically; anything else quarantines nothing
    if not isinstance(entries, dict):
        return {}
    return {
        str(device): dict(entry)
        for device, entry in list(entries.items())[:MAX_ENTRIES]
        if isinstance(entry, dict) and isinstance(entry.get("until"), (int, float)) and entry["until"] > now
    }


def failed_devices(failure: Mapping[str, Any], allocated: Sequence[Device], *, positional: bool) -> list[Device]:
    """The devices of ``allocated`` that ``failure`` names (by UUID, or by index as the task saw it).

    :param positional: the task saw its devices numbered from 0 in the order given (a container); else by the
        host's index (a local child process)
    """
    found: list[Device] = []
    for gpu in failure.get("gpus") or []:
        uuid, index = str(gpu.get("uuid") or ""), str(gpu.get("index"))
        match = [d for d in allocated if d.id == uuid]
        if not match and positional and index.isdigit() and int(index) < len(allocated):
            match = [allocated[int(index)]]
        elif not match and not positional:
            match = [d for d in allocated if d.id == index]
        found += [d for d in match if d not in found]
    return found


def quarantine(
    state_dir: str | os.PathLike[str], devices: Sequence[Device], reason: str, seconds: float, log: logging.Logger
) -> None:
    """Leave ``devices`` out of this host's allocations for ``seconds`` (nothing when 0), and say so."""
    if not devices or seconds <= 0:
        return
    path = _file(state_dir)
    with exclusive(path.with_suffix(".lock")):
        entries = quarantined(state_dir)
        until = time.time() + seconds
        for device in devices:
            entries[device.id] = {"until": until, "reason": reason[:500]}
        folder = private_dir(path.parent)
        descriptor, temporary = tempfile.mkstemp(prefix=".gpus-", suffix=".tmp", dir=folder)  # 0600
        try:
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                json.dump(entries, handle)
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
    ids = ", ".join(device.id for device in devices)
    log.error(
        "[gpu] GPU %s quarantined on this host for %.0fs (until %s; [gpu] quarantine_seconds): %s",
        ids,
        seconds,
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(until)),
        reason,
    )


def usable(
    state_dir: str | os.PathLike[str], candidates: Sequence[Device], log: logging.Logger
) -> tuple[list[Device], list[str]]:
    """``candidates`` less the quarantined devices, and each of those in words (also in the log).

    :return: the usable devices, and ``"GPU 0 is quarantined until 2025-01-01 12:00:00 (Xid 79 ...)"`` lines
    """
    held, left_out = quarantined(state_dir), []
    for device in candidates:
        if device.id in held:
            until = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(held[device.id]["until"]))
            left_out.append(f"GPU {device.id} is quarantined until {until} ({held[device.id]['reason']})")
            log.warning("[gpu] %s: skipped", left_out[-1])
    return [device for device in candidates if device.id not in held], left_out


@contextlib.contextmanager
def on_fault(host: Any, allocated: Sequence[Device], log: logging.Logger, *, positional: bool) -> Iterator[None]:
    """Quarantine those of ``allocated`` that an infrastructure failure raised inside names (an Xid, ECC).

    :param host: the :class:`~.allocator.HostGpus` they came from (its state dir, ``[gpu] quarantine_seconds``)
    :param positional: the task saw its devices numbered from 0 in the order given (a container)
    """
    try:
        yield
    except GpuInfrastructureError as err:
        if err.failure is not None and allocated:
            failed = failed_devices(err.failure, allocated, positional=positional)
            reason = "; ".join(str(line) for line in err.failure.get("evidence") or []) or str(err.failure["reason"])
            quarantine(host.state_dir, failed, reason, host.quarantine_seconds, log)
        raise
