"""The trigger skeleton a deferred job waits on: one decision loop over looks at the job, one event.

A backend's trigger says how to look at its job once (:meth:`JobTrigger.look`, run in a thread: the clients are
synchronous) and how to stop it (:meth:`JobTrigger.stop`: a user ended the deferred task, and Airflow 3.3's
triggerer calls ``on_kill``; not on a triggerer restart, which only moves the trigger). The skeleton decides, in
:meth:`JobTrigger.watch`, when to fire: the job ended (the look's status), waited too long to start
(``pending``, at ``pending_deadline``) or outlived the task's ``execution_timeout`` (``timeout``, at
``deadline``). Every event echoes the deferral's state, so that the event alone resumes the task (``dag.test()``
passes on no more). A backend whose looks can be shared by the tasks of one cluster (one query for all of them)
feeds :meth:`~JobTrigger.watch` from Airflow's shared stream instead (``BaseEventTrigger.shared_stream_key``:
``slurm/trigger.py``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent


@dataclass(frozen=True)
class Look:
    """The job, as one look saw it.

    :param status: the event to fire now (``"ended"``, ``"missing"``, a backend's own), or ``None`` while it runs
    :param pending: it still waits to start (for the resources): ``pending_deadline`` applies
    :param details: what the event carries besides
    """

    status: str | None = None
    pending: bool = False
    details: dict[str, Any] = field(default_factory=dict)


class JobTrigger(BaseEventTrigger):
    """Fire when the job ended or is gone (its look says so), waited past ``pending_deadline``, or at ``deadline``.

    :param job_id: the task's job
    :param where: how to reach the job's engine or cluster (JSON; never a credential: the triggerer reads those
        itself, from a connection or its own configuration)
    :param poll_interval: seconds between two looks (``[gpu] poll_interval``)
    :param deadline: when the task times out (seconds since the epoch), or ``None``
    :param pending_deadline: when a job still waiting to start counts as missing its GPUs, or ``None``
    :param state: what the task's resume needs (the ``Deferral``'s state), echoed in every event
    """

    #: a deferred task's trigger runs on the task's triggerer queue ([triggerer] queues_enabled)
    supports_triggerer_queue = True
    noun = "job"

    def __init__(
        self,
        job_id: str,
        where: dict[str, Any],
        poll_interval: float = 1.0,
        deadline: float | None = None,
        pending_deadline: float | None = None,
        *,
        state: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.job_id = job_id
        self.where = dict(where)
        self.poll_interval = poll_interval
        self.deadline = deadline
        self.pending_deadline = pending_deadline
        self.state = dict(state or {})

    def arguments(self) -> dict[str, Any]:
        """The keyword arguments the triggerer rebuilds the trigger from (a subclass adds its own)."""
        return {
            "job_id": self.job_id,
            "where": self.where,
            "poll_interval": self.poll_interval,
            "deadline": self.deadline,
            "pending_deadline": self.pending_deadline,
            "state": self.state,
        }

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """The classpath and the arguments the triggerer rebuilds the trigger from."""
        return f"{type(self).__module__}.{type(self).__qualname__}", self.arguments()

    def event(self, status: str, **details: Any) -> TriggerEvent:
        """The one event: its status, the job, the details, and the deferral's state."""
        payload = {"status": status, "job_id": self.job_id, **details}
        return TriggerEvent({**payload, "state": {"phase": "run", "backend": self.state}})

    def look(self) -> Look:
        """Look at the job once (in a thread)."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the job and remove it (in a thread): a user ended the deferred task."""
        raise NotImplementedError

    async def details(self, status: str) -> dict[str, Any]:
        """What an event of ``status`` carries besides the look's details (Docker: how much output was logged)."""
        return {}

    async def looks(self) -> AsyncIterator[Look]:
        """One look every ``poll_interval`` seconds (sooner when the deadline comes first)."""
        while True:
            yield await asyncio.to_thread(self.look)
            delay = self.poll_interval
            if self.deadline is not None:
                delay = min(delay, max(self.deadline - time.time(), 0.01))
            await asyncio.sleep(delay)

    async def watch(self, looks: AsyncIterator[Look]) -> AsyncIterator[TriggerEvent]:
        """The decision: the first look that ends the wait, or the deadline, gives the one event."""
        async for look in looks:
            status = look.status
            if status is None and self.deadline is not None and time.time() >= self.deadline:
                status = "timeout"
            pending_over = self.pending_deadline is not None and time.time() >= self.pending_deadline
            if status is None and look.pending and pending_over:
                status = "pending"
            if status is not None:
                yield self.event(status, **look.details, **await self.details(status))
                return

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Look at the job every ``poll_interval`` seconds until the wait ends."""
        self.log.info("Watching %s %s every %ss until it ends", self.noun, self.job_id, self.poll_interval)
        async for event in self.watch(self.looks()):
            yield event

    async def on_kill(self) -> None:
        """A user ended the deferred task: stop its job."""
        self.log.warning("The task was ended by a user: stopping %s %s", self.noun, self.job_id)
        await asyncio.to_thread(self.stop)
