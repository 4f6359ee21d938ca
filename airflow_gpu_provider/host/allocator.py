"""Host-wide, exclusive, crash-safe GPU allocation: one ``flock`` per device under the state dir.

The kernel drops a flock when the last descriptor of its open file closes, so the GPUs of a killed task come
back by themselves. The child process inherits the descriptors (``Allocation.fds``), so a lock is held as long as
either the worker or the task process lives. Lock files are the worker's own (0600, in a private folder, never
opened through a symlink: :mod:`.state`), so no other user can hold or redirect them.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_gpu_provider.exceptions import GpuUnavailableError
from airflow_gpu_provider.host import quarantine, shares
from airflow_gpu_provider.host.busy import describe, left_out, what_helps
from airflow_gpu_provider.host.inventory import (
    Device,
    host_devices,
    larger,
    matching,
    model_groups,
    narrowed,
    right_sized,
    right_sized_share,
)
from airflow_gpu_provider.host.state import open_private, private_dir
from airflow_gpu_provider.host.waiting import MustWait, wait_for
from airflow_gpu_provider.host.workers import describe_holder
from airflow_gpu_provider.settings import GpuVendor
from airflow_gpu_provider.settings.shares import GpuShare
from airflow_gpu_provider.task.environment import lock_holder
from airflow_gpu_provider.task.missing_gpu import POLICIES, OnMissingGpu
from airflow_gpu_provider.task.request import TaskRequest

if TYPE_CHECKING:
    from airflow_gpu_provider.config.worker import GpuConfig

INFO_SIZE = 1024  # bytes of the holder record of a GPU lock: JSON (a holder of 150 characters at most), padded
#: the daemon a GPU's shares need (its MPS daemon: ``host/mps.py``), or ``None``
Daemon = Callable[[Device], shares.GpuDaemon | None]


@dataclass
class Allocation:
    """GPUs held by one task. ``devices`` is empty for a CPU run (``reason`` says why after a CPU fallback).

    :param share: a share of ``devices[0]`` (``host/shares.py``), whose descriptors are ``fds``
    """

    devices: list[Device]
    fds: list[int] = field(default_factory=list)
    cpu_fallback: bool = False
    reason: str = ""
    share: shares.Held | None = None

    def release(self) -> None:
        """Drop the locks (idempotent). Closing the descriptor releases the flock."""
        if self.share is not None:
            self.share.release()
        while self.fds:
            os.close(self.fds.pop())

    def __enter__(self) -> Allocation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class GpuAllocator:
    """Hands out concrete devices to tasks on one host.

    :param lock_dir: directory for ``<vendor>-<id>.lock`` files; every worker on the host must use the same one
    :param vendor: vendor name, part of the lock file names
    :param poll_interval: seconds between attempts while waiting
    """

    def __init__(self, lock_dir: str | os.PathLike[str], vendor: str = "nvidia", poll_interval: float = 5.0) -> None:
        self.lock_dir, self.vendor, self.poll_interval = Path(lock_dir), vendor, poll_interval

    def lock_path(self, device: Device) -> Path:
        """The lock file of one device."""
        safe_id = "".join(c if c.isalnum() or c in "-_." else "_" for c in device.id)
        return self.lock_dir / f"{self.vendor}-{safe_id}.lock"

    def try_acquire(
        self,
        candidates: Sequence[Device],
        count: int,
        holder: str,
        groups: Sequence[Sequence[Device]] = (),
        *,
        share: GpuShare | None = None,
        daemon: Daemon | None = None,
    ) -> Allocation | None:
        """Lock ``count`` free devices now, or none at all; or ``share`` of one of them.

        :param groups: the candidates of each model of a fallback list, preferred first: all devices from the first
            group with ``count`` free, never a mix of models (:func:`.inventory.model_groups`)
        :param daemon: what the shares of a GPU need running (:func:`.shares.place`)
        """
        private_dir(self.lock_dir)
        take = self._try_group if share is None else lambda group, _, who: self._try_share(group, share, who, daemon)
        return next(filter(None, (take(group, count, holder) for group in groups or [candidates])), None)

    def _try_share(self, gpus: Sequence[Device], share: GpuShare, holder: str, daemon: Daemon | None) -> Any:
        first = None if daemon is None else (lambda index: daemon(gpus[index]))
        taken = shares.place_best([(self.lock_path(d), d.memory_total) for d in gpus], share, holder, first)
        return None if taken is None else Allocation([gpus[taken[0]]], taken[1].fds, share=taken[1])

    def _try_group(self, candidates: Sequence[Device], count: int, holder: str) -> Allocation | None:
        allocation = Allocation(devices=[])
        for device in candidates:
            fd = open_private(self.lock_path(device))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            info = json.dumps({"holder": holder[:150], "pid": os.getpid(), "since": time.time()})
            os.pwrite(fd, info.ljust(INFO_SIZE).encode(), 0)  # a fixed size: no ftruncate (milliseconds on some disks)
            allocation.devices.append(device)
            allocation.fds.append(fd)
            if len(allocation.devices) == count:
                return allocation
        allocation.release()
        return None

    def holder_of(self, device: Device) -> str | None:
        """Who holds a device (a whole-GPU task, or the tasks that hold shares of it), or ``None`` when it is free."""
        path = self.lock_path(device)
        if not path.exists():
            return None
        fd = open_private(path, os.O_RDONLY)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                try:
                    info = json.loads(os.pread(fd, 4096, 0) or b"{}")
                except ValueError:
                    info = {}
                return describe_holder(info)
        finally:
            os.close(fd)
        return shares.holders(path)

    def acquire(
        self,
        candidates: Sequence[Device],
        count: int,
        *,
        policy: OnMissingGpu,
        holder: str,
        requested: str,
        present: Sequence[Device],
        log: logging.Logger,
        timeout: float = float("inf"),
        defer: bool = False,
        sleep: Callable[[float], None] = time.sleep,
        groups: Sequence[Sequence[Device]] = (),
        quarantined: Sequence[str] = (),
        share: GpuShare | None = None,
        daemon: Daemon | None = None,
    ) -> Allocation:
        """Lock ``count`` of ``candidates`` according to ``policy`` (or ``share`` of one of them: ``count`` is 1).

        :param candidates: devices that match the request (model, MIG profile)
        :param requested: the request in words, for messages ("2x nvidia A100")
        :param present: every device of the host, for messages
        :param timeout: seconds to wait with ``"wait"`` (``[gpu] wait_timeout``)
        :param defer: with ``"wait"``, raise :class:`MustWait` instead of waiting here (``deferrable=True``)
        :param groups: the candidates by model of a fallback list, preferred first (:meth:`try_acquire`)
        :param quarantined: the matching devices left out of ``candidates`` by their quarantine, in words
        :param daemon: what the shares of a GPU need running (:func:`.shares.place`)
        :raises GpuUnavailableError: with ``policy="fail"``, or with ``"wait"`` when the host can never satisfy it
            or the wait timed out
        """
        attempt = lambda: self.try_acquire(candidates, count, holder, groups, share=share, daemon=daemon)  # noqa: E731
        allocation = attempt()
        if allocation is not None:
            return allocation
        state = describe(self.holder_of, self.lock_path, present, candidates, share is not None)
        rule = POLICIES[policy]
        if rule.runs_on_cpu:
            log.warning("Requested %s but %s. on_missing_gpu='cpu': running on CPU instead.", requested, state)
            return Allocation(devices=[], cpu_fallback=True, reason=f"requested {requested} but {state}")
        if share is not None:  # the GPUs that could ever hold it
            candidates = [d for d in candidates if share.parts_on(d.memory_total) is not None]
            groups = [[d for d in group if d in candidates] for group in groups]
        enough = max((len(group) for group in groups or [candidates]), default=0)  # of one model
        if quarantined and enough < count:  # not the request's fault: the GPUs it needs failed a while ago
            raise GpuUnavailableError(left_out(requested, quarantined, state))
        if not rule.waits or enough < count:
            helps = what_helps(enough, count, rule, share=share is not None)
            raise GpuUnavailableError(f"Requested {requested} but {state}. {helps}")
        if defer:
            parts = [share.parts_on(d.memory_total) or 0 for d in candidates] if share is not None else []
            raise MustWait([str(self.lock_path(d)) for d in candidates], count, requested, state, timeout, parts)
        log.info("Requested %s but %s. Waiting for GPUs to become free (on_missing_gpu='wait').", requested, state)
        now = lambda: describe(self.holder_of, self.lock_path, present, candidates, share is not None)  # noqa: E731
        return wait_for(attempt, now, requested, poll=self.poll_interval, timeout=timeout, log=log, sleep=sleep)


@dataclass(frozen=True)
class HostGpus:
    """The GPUs of this host as the local and Docker backends share them: the inventory and one lock per device.

    :param devices: ``[gpu] devices``: ``auto`` (NVML), ``none``, or device ids
    :param state_dir: the host-wide state dir (``[gpu] state_dir``); the locks live in its ``locks`` folder
    :param poll_interval: seconds between attempts with ``on_missing_gpu="wait"``
    :param only: a task's ``devices`` option: the ids it may take, of the host's (``inventory.narrowed``)
    """

    devices: str
    state_dir: str
    poll_interval: float = 5.0
    wait_timeout: float = float("inf")
    quarantine_seconds: float = 3600.0  # a GPU that failed (an Xid, ECC errors) is skipped this long (quarantine.py)
    only: tuple[str, ...] = ()

    @classmethod
    def configured(cls, conf: GpuConfig, *, only: Sequence[str] = ()) -> HostGpus:
        """From the worker's ``[gpu]`` options; ``only``: the task's ``devices``, which narrow the host's GPUs."""
        limits = (conf.poll_interval, conf.wait_timeout, conf.quarantine_seconds)
        return cls(conf.devices, conf.state_dir, *limits, only=tuple(only))

    def present(self, vendor: GpuVendor) -> list[Device]:
        """The host's devices of ``vendor`` (those the task's ``devices`` name, when it names some)."""
        return narrowed(host_devices(self.devices, vendor), self.only, self.devices)

    def allocate(
        self,
        request: TaskRequest,
        *,
        backend: str,
        log: logging.Logger,
        present: Sequence[Device] | None = None,
        daemon: Daemon | None = None,
    ) -> Allocation:
        """Lock the devices a request needs (model and MIG filters applied), as its ``on_missing_gpu`` says.

        ``gpu_count="all"`` takes every matching device; a share (``ResourceSettings.share``) a part of one GPU, by
        memory (``host/shares.py``). Local and Docker tasks take their GPUs here, so that tasks of both never share
        a GPU unless both asked for a share.

        :param present: the host's devices, when the caller has listed them already
        :param daemon: what the shares of a GPU need running: its MPS daemon (``host/mps.py``)
        """
        resources = request.resources
        if not resources.requests_gpus:
            return Allocation(devices=[])
        if present is None:
            present = self.present(resources.gpu_vendor)
        candidates, quarantined = quarantine.usable(self.state_dir, matching(resources, present), log)
        requested = resources.describe().split(",")[0]
        share = resources.share
        if request.min_gpu_memory is not None:  # a try after a GPU out-of-memory failure
            policy, minimum = request.missing_gpu, request.min_gpu_memory
            found = larger(candidates, present, minimum, requested=requested, policy=policy, log=log)
            if found is None:
                why = "larger than the GPU that ran out of memory, but this host has none"
                return Allocation(devices=[], cpu_fallback=True, reason=f"requested {requested} {why}")
            candidates = found
        elif request.right_size and share is not None:  # the share sized by the last successful run's peak
            share = right_sized_share(share, candidates, int(request.right_size["need"]), log)
        elif request.right_size:  # right_size=True: the smallest GPUs that held the last successful run's peak
            candidates = right_sized(candidates, int(request.right_size["need"]), log)
        groups = model_groups(resources, candidates)
        first_present = next((group for group in groups if group), candidates)
        count = len(first_present) if isinstance(resources.gpu_count, str) else max(1, int(resources.gpu_count))
        if count == 0:  # "all" on a host with none
            if request.missing_gpu.runs_on_cpu:
                log.warning("Requested %s but this host has none; running on CPU.", requested)
                return Allocation(devices=[], cpu_fallback=True, reason=f"requested {requested} but this host has none")
            raise GpuUnavailableError(f"Requested {requested} but this host has no matching GPUs.")
        allocator = GpuAllocator(Path(self.state_dir) / "locks", resources.gpu_vendor.name, self.poll_interval)
        return allocator.acquire(
            candidates,
            count,
            policy=request.on_missing_gpu,
            holder=lock_holder(request, backend),
            requested=requested,
            present=present,
            log=log,
            timeout=self.wait_timeout,
            defer=request.defer_wait,
            groups=groups,
            quarantined=quarantined,
            share=share,
            daemon=daemon,
        )
