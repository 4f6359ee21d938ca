"""The trigger a task waiting for GPUs defers to: it fires when enough of this host's GPUs are free.

It reads the host's GPU locks (``host/waiting.py``), so it must run in a triggerer on the same host as the task's
worker: with ``[triggerer] queues_enabled = True``, a triggerer per GPU host started for that host's queue
(``airflow triggerer --queues gpu-host-1``) runs it (docs/deferrable.md). It never takes a lock: when it fires, the
task starts again on a worker and allocates; a task that loses the race defers again.

A task that must wait for GPUs can also start here, before any worker ran it (Airflow's ``start_from_trigger``:
:func:`start_args`, :class:`GpuStartTrigger`), so that it holds no worker slot from its start until its GPUs are free.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from airflow.triggers.base import BaseTrigger, StartTriggerArgs, TriggerEvent

from airflow_gpu_provider.host.waiting import ready

if TYPE_CHECKING:
    from airflow_gpu_provider.settings.resources import ResourceSettings

#: The most lock files a wait looks at (a host's GPUs and their MIG slices), and the shortest time between two
#: looks: a trigger row is data (a DAG's own code can defer to this trigger), and the triggerer's loop is everyone's.
MAX_LOCKS = 512
MIN_POLL = 0.05


class GpuFreeTrigger(BaseTrigger):
    """Fire ``{"status": "free"}`` when ``count`` of ``lock_files`` are free, ``{"status": "timeout"}`` at the deadline.

    A share's wait (``parts``) fires when one of the GPUs has the parts it needs unpromised.

    :param lock_files: the lock files of the devices that would do
    :param count: how many must be free at once
    :param deadline: when the wait ends (seconds since the epoch)
    :param poll_interval: seconds between two looks (``[gpu] poll_interval``)
    :param requested: the request in words, for the log
    :param since: when the wait began (seconds since the epoch), for the log and the event
    :param parts: a share's wait: the parts of each GPU of ``lock_files`` it needs (``host/waiting.py`` ``ready``)
    """

    def __init__(
        self,
        lock_files: list[str],
        count: int,
        deadline: float,
        *,
        poll_interval: float = 1.0,
        requested: str = "GPUs",
        since: float | None = None,
        parts: list[int] | None = None,
    ) -> None:
        super().__init__()
        if len(lock_files) > MAX_LOCKS:
            raise ValueError(f"a wait for GPUs looks at {MAX_LOCKS} lock files at most, not {len(lock_files)}")
        self.lock_files = list(lock_files)
        self.count = count
        self.deadline = deadline
        self.poll_interval = max(float(poll_interval), MIN_POLL)
        self.requested = requested
        self.since = time.time() if since is None else since
        self.parts = list(parts or [])

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """The classpath and the arguments the triggerer rebuilds the trigger from."""
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "lock_files": self.lock_files,
                "count": self.count,
                "deadline": self.deadline,
                "poll_interval": self.poll_interval,
                "requested": self.requested,
                "since": self.since,
                **({"parts": self.parts} if self.parts else {}),
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Look every ``poll_interval`` seconds; log while waiting (every minute, then less often)."""
        next_report = 60.0
        while True:
            over, free = await asyncio.to_thread(ready, self.lock_files, self.count, self.parts)  # /proc/locks, stats
            waited = time.time() - self.since
            # the event carries what the task's resume needs: a runner may pass on no more (dag.test())
            state = {
                "phase": "wait",
                "since": self.since,
                "requested": self.requested,
                "limit": self.deadline - self.since,
                "count": self.count,
            }
            if over:
                yield TriggerEvent({"status": "free", "waited": waited, "free": free, "state": state})
                return
            if time.time() >= self.deadline:
                yield TriggerEvent({"status": "timeout", "waited": waited, "free": free, "state": state})
                return
            if waited >= next_report:
                self.log.info("Still waiting for %s after %.0fs: %d of them free.", self.requested, waited, free)
                next_report *= 2
            await asyncio.sleep(min(self.poll_interval, max(self.deadline - time.time(), MIN_POLL)))


class GpuStartTrigger(GpuFreeTrigger):
    """The wait of a task that starts in the triggerer (``start_from_trigger``), before any worker has run it.

    Its arguments are fixed when the DAG is parsed (:func:`start_args`): the GPUs the task asks for (``gpus``,
    ``ResourceSettings.to_dict()``) and its ``wait_timeout`` (``limit``). Which of this host's GPUs would do, where
    their locks lie, the default limit and the poll interval are the triggerer's ``[gpu]`` options, read when it
    starts: as for every wait, it must be the triggerer of the task's host. It fires when enough are free (a worker
    then starts the task, which allocates them; a lost race defers again from the worker), at the limit, or at once
    for a request this host can never meet (the worker's allocation then fails saying why).
    """

    def __init__(self, gpus: dict[str, Any], limit: float | None = None) -> None:
        super().__init__([], 0, float("inf"))
        self.gpus, self.limit = dict(gpus), limit

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """The classpath and the arguments (the task's, from :func:`start_args`)."""
        return f"{type(self).__module__}.{type(self).__qualname__}", {"gpus": self.gpus, "limit": self.limit}

    def _resolve(self) -> None:
        """Find the locks of the GPUs of this host that would do, how many must be free, the deadline (``[gpu]``)."""
        from pathlib import Path

        from airflow_gpu_provider.config.worker import GpuConfig
        from airflow_gpu_provider.host.allocator import GpuAllocator, HostGpus
        from airflow_gpu_provider.host.inventory import matching
        from airflow_gpu_provider.settings.resources import ResourceSettings

        conf = GpuConfig.read()
        host, resources = HostGpus.configured(conf), ResourceSettings(**self.gpus)
        candidates = matching(resources, host.present(resources.gpu_vendor))
        allocator = GpuAllocator(Path(host.state_dir) / "locks", resources.gpu_vendor.name, host.poll_interval)
        count = len(candidates) if isinstance(resources.gpu_count, str) else max(1, int(resources.gpu_count or 0))
        share = resources.share
        if share is not None:  # the GPUs that could ever hold it, and what it needs of each
            candidates = [d for d in candidates if share.parts_on(d.memory_total) is not None]
            self.parts = [share.parts_on(d.memory_total) or 0 for d in candidates]
        self.lock_files = [str(allocator.lock_path(device)) for device in candidates]
        self.count = count if 0 < count <= len(candidates) else 0  # never enough here: the worker says why
        self.requested = resources.describe().split(",")[0]
        self.poll_interval = max(conf.poll_interval, MIN_POLL)
        self.since = time.time()
        self.deadline = self.since + (self.limit if self.limit is not None else conf.wait_timeout)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Find this host's locks (off the event loop: NVML may be asked), then wait as :class:`GpuFreeTrigger`."""
        await asyncio.to_thread(self._resolve)
        self.log.info("Started in the triggerer: waiting for %s before the task takes a worker slot", self.requested)
        async for event in super().run():
            yield event


def start_args(resources: ResourceSettings, wait_timeout: float | None) -> StartTriggerArgs:
    """Airflow's ``start_trigger_args`` of a task that starts by waiting for its GPUs (:class:`GpuStartTrigger`).

    Whether a task starts so is the task's (``TaskSpec.starts_in_triggerer``); the trigger's event comes back to
    ``execute_complete`` as a deferred wait's does: it starts the task.
    """
    return StartTriggerArgs(
        trigger_cls=f"{GpuStartTrigger.__module__}.{GpuStartTrigger.__qualname__}",
        trigger_kwargs={"gpus": resources.to_dict(), "limit": wait_timeout},
        next_method="execute_complete",
        next_kwargs=None,
        timeout=None,
    )
