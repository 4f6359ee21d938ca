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
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_gpu_provider.exceptions import GpuUnavailableError
from airflow_gpu_provider.host import quarantine
from airflow_gpu_provider.host.inventory import Device, host_devices, matching, model_groups, narrowed, right_sized
from airflow_gpu_provider.host.state import open_private, private_dir
from airflow_gpu_provider.host.waiting import MustWait, waited_too_long
from airflow_gpu_provider.host.workers import describe_holder
from airflow_gpu_provider.settings import GpuVendor
from airflow_gpu_provider.settings.units import format_bytes
from airflow_gpu_provider.task.environment import lock_holder
from airflow_gpu_provider.task.missing_gpu import POLICIES, MissingGpuPolicy, OnMissingGpu
from airflow_gpu_provider.task.request import TaskRequest

if TYPE_CHECKING:
    from airflow_gpu_provider.config.worker import GpuConfig


@dataclass
class Allocation:
    """GPUs held by one task. ``devices`` is empty for a CPU run (``reason`` says why after a CPU fallback)."""

    devices: list[Device]
    fds: list[int] = field(default_factory=list)
    cpu_fallback: bool = False
    reason: str = ""

    def release(self) -> None:
        """Drop the locks (idempotent). Closing the descriptor releases the flock."""
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
        self, candidates: Sequence[Device], count: int, holder: str, groups: Sequence[Sequence[Device]] = ()
    ) -> Allocation | None:
        """Lock ``count`` free devices now, or none at all.

        :param groups: the candidates of each model of a fallback list, preferred first: all devices from the first
            group with ``count`` free, never a mix of models (:func:`.inventory.model_groups`)
        """
        private_dir(self.lock_dir)
        return next(filter(None, (self._try_group(group, count, holder) for group in groups or [candidates])), None)

    def _try_group(self, candidates: Sequence[Device], count: int, holder: str) -> Allocation | None:
        allocation = Allocation(devices=[])
        for device in candidates:
            fd = open_private(self.lock_path(device))
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            info = json.dumps({"holder": holder, "pid": os.getpid(), "since": time.time()}).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, info, 0)
            allocation.devices.append(device)
            allocation.fds.append(fd)
            if len(allocation.devices) == count:
                return allocation
        allocation.release()
        return None

    def holder_of(self, device: Device) -> str | None:
        """Who holds a device, from its lock file, or ``None`` when it is free."""
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
            return None
        finally:
            os.close(fd)

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
    ) -> Allocation:
        """Lock ``count`` of ``candidates`` according to ``policy``.

        :param candidates: devices that match the request (model, MIG profile)
        :param requested: the request in words, for messages ("2x nvidia A100")
        :param present: every device of the host, for messages
        :param timeout: seconds to wait with ``"wait"`` (``[gpu] wait_timeout``)
        :param defer: with ``"wait"``, raise :class:`MustWait` instead of waiting here (``deferrable=True``)
        :param groups: the candidates by model of a fallback list, preferred first (:meth:`try_acquire`)
        :param quarantined: the matching devices left out of ``candidates`` by their quarantine, in words
        :raises GpuUnavailableError: with ``policy="fail"``, or with ``"wait"`` when the host can never satisfy it
            or the wait timed out
        """
        allocation = self.try_acquire(candidates, count, holder, groups)
        if allocation is not None:
            return allocation
        state = self._describe(present, candidates)
        rule = POLICIES[policy]
        if rule.runs_on_cpu:
            log.warning("Requested %s but %s. on_missing_gpu='cpu': running on CPU instead.", requested, state)
            return Allocation(devices=[], cpu_fallback=True, reason=f"requested {requested} but {state}")
        enough = max((len(group) for group in groups or [candidates]), default=0)  # of one model
        if quarantined and enough < count:  # not the request's fault: the GPUs it needs failed a while ago
            raise GpuUnavailableError(
                f"Requested {requested} but {'; '.join(quarantined)}, left out after a fault of the GPU itself "
                f"([gpu] quarantine_seconds); {state}. It comes back by itself then: run the task later or on "
                "another host, or set on_missing_gpu='cpu' to run on CPU."
            )
        if not rule.waits or enough < count:
            raise GpuUnavailableError(f"Requested {requested} but {state}. {_what_helps(enough, count, rule)}")
        if defer:
            raise MustWait([str(self.lock_path(d)) for d in candidates], count, requested, state, timeout)
        log.info("Requested %s but %s. Waiting for GPUs to become free (on_missing_gpu='wait').", requested, state)
        waited, next_report = 0.0, 60.0
        while True:
            delay = min(self.poll_interval * random.uniform(0.8, 1.2), max(timeout - waited, 0.01))
            sleep(delay)
            waited += delay
            allocation = self.try_acquire(candidates, count, holder, groups)
            if allocation is not None:
                log.info("Got GPUs %s after waiting %.0fs.", [d.id for d in allocation.devices], waited)
                return allocation
            if waited >= timeout:
                now = self._describe(present, candidates)
                raise GpuUnavailableError(waited_too_long(requested, waited, timeout, now))
            if waited >= next_report:
                log.info(
                    "Still waiting for %s after %.0fs: %s.", requested, waited, self._describe(present, candidates)
                )
                next_report *= 2

    def _describe(self, present: Sequence[Device], candidates: Sequence[Device]) -> str:
        if not present:
            return "this host has no GPUs (none found by NVML and none listed in [gpu] devices)"
        busy = {d.id: self.holder_of(d) for d in candidates}
        parts = [f"this host has {len(present)} GPU(s) ({', '.join(d.name or d.id for d in present)})"]
        if len(candidates) != len(present):
            parts.append(f"{len(candidates)} of them match the request and are usable")
        taken = [f"{device_id} held by {who}" for device_id, who in busy.items() if who]
        free = [device_id for device_id, who in busy.items() if not who]
        parts.append(f"free: {', '.join(free) or 'none'}")
        parts += [f"busy: {'; '.join(taken)}"] if taken else []
        return ", ".join(parts)


def _what_helps(matching: int, count: int, rule: MissingGpuPolicy) -> str:
    """What the task's author can do on this host: waiting helps only where enough GPUs exist and are busy."""
    if matching >= count:
        return "Set on_missing_gpu='wait' to wait for the busy GPUs, or on_missing_gpu='cpu' to run on CPU."
    never = "Waiting cannot help: the host does not have that many. " if rule.waits else ""
    return (
        f"{never}Set on_missing_gpu='cpu' to run on CPU, run the task where there are GPUs (a GPU worker's queue, "
        "the Docker or Kubernetes backend), or list this host's GPUs in [gpu] devices."
    )


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
        self, request: TaskRequest, *, backend: str, log: logging.Logger, present: Sequence[Device] | None = None
    ) -> Allocation:
        """Lock the devices a request needs (model and MIG filters applied), as its ``on_missing_gpu`` says.

        ``gpu_count="all"`` takes every matching device. Local and Docker tasks take their GPUs here, so that
        tasks of both never share a GPU.

        :param present: the host's devices, when the caller has listed them already
        """
        resources = request.resources
        if not resources.requests_gpus:
            return Allocation(devices=[])
        if present is None:
            present = self.present(resources.gpu_vendor)
        candidates, quarantined = quarantine.usable(self.state_dir, matching(resources, present), log)
        requested = resources.describe().split(",")[0]
        if request.min_gpu_memory is not None:  # a try after a GPU out-of-memory failure
            larger = [d for d in candidates if d.memory_total is not None and d.memory_total > request.min_gpu_memory]
            if not larger and request.missing_gpu.runs_on_cpu:
                log.warning("Requested %s larger than the GPU that ran out of memory, but this host has none; "
                            "running on CPU (on_missing_gpu='cpu').", requested)  # fmt: skip
                reason = f"requested {requested} larger than the GPU that ran out of memory, but this host has none"
                return Allocation(devices=[], cpu_fallback=True, reason=reason)
            if not larger:
                sizes = {d.id: format_bytes(d.memory_total) if d.memory_total else "unknown memory" for d in present}
                known, limit = ", ".join(f"{i}: {m}" for i, m in sizes.items()) or "none", request.min_gpu_memory
                raise GpuUnavailableError(
                    f"Requested {requested} with more than {format_bytes(limit)} of memory, after a try "
                    f"ran out of GPU memory, but no GPU of this host has more ({known}). Give the task a smaller "
                    "batch, an on_oom ladder of accelerators on Kubernetes, or list the GPUs' models in [gpu] devices "
                    "(0=L4,1=A100-80GB) when NVML cannot tell their memory."
                )
            candidates = sorted(larger, key=lambda d: d.memory_total or 0)  # the smallest GPU that is larger
        elif request.right_size:  # right_size=True: the smallest GPUs that held the last successful run's peak
            candidates = right_sized(candidates, int(request.right_size["need"]), log)
        groups = model_groups(resources, candidates)
        first_present = next((group for group in groups if group), candidates)
        # a share of a GPU (0.5) never reaches a host backend: BackendInfo.check refuses it there
        count = len(first_present) if isinstance(resources.gpu_count, str) else int(resources.gpu_count)
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
        )
