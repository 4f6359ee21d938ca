"""The trigger a task waiting for GPUs defers to: it fires when enough of this host's GPUs are free.

It reads the host's GPU locks (``host/waiting.py``), so it must run in a triggerer on the same host as the task's
worker: with ``[triggerer] queues_enabled = True``, a triggerer per GPU host started for that host's queue
(``airflow triggerer --queues gpu-host-1``) runs it (docs/deferrable.md). It never takes a lock: when it fires, the
task starts again on a worker and allocates; a task that loses the race defers again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_gpu_provider.host.waiting import free_count


class GpuFreeTrigger(BaseTrigger):
    """Fire ``{"status": "free"}`` when ``count`` of ``lock_files`` are free, ``{"status": "timeout"}`` at the deadline.

    :param lock_files: the lock files of the devices that would do
    :param count: how many must be free at once
    :param deadline: when the wait ends (seconds since the epoch)
    :param poll_interval: seconds between two looks (``[gpu] trigger_poll_interval``)
    :param requested: the request in words, for the log
    :param since: when the wait began (seconds since the epoch), for the log and the event
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
    ) -> None:
        super().__init__()
        self.lock_files = list(lock_files)
        self.count = count
        self.deadline = deadline
        self.poll_interval = poll_interval
        self.requested = requested
        self.since = time.time() if since is None else since

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
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Look every ``poll_interval`` seconds; log while waiting (every minute, then less often)."""
        next_report = 60.0
        while True:
            free = free_count(self.lock_files)  # a read of /proc/locks and a stat per device: never blocks
            waited = time.time() - self.since
            # the event carries what the task's resume needs: a runner may pass on no more (dag.test())
            state = {
                "phase": "wait",
                "since": self.since,
                "requested": self.requested,
                "limit": self.deadline - self.since,
                "count": self.count,
            }
            if free >= self.count:
                yield TriggerEvent({"status": "free", "waited": waited, "free": free, "state": state})
                return
            if time.time() >= self.deadline:
                yield TriggerEvent({"status": "timeout", "waited": waited, "free": free, "state": state})
                return
            if waited >= next_report:
                self.log.info("Still waiting for %s after %.0fs: %d of them free.", self.requested, waited, free)
                next_report *= 2
            await asyncio.sleep(min(self.poll_interval, max(self.deadline - time.time(), 0.01)))
