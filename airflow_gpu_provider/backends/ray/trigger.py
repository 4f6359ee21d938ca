"""The trigger a deferred Ray task waits on: it fires when the task's job has ended, by polling the Jobs API.

It reaches the cluster as the task did (the connection's id or the address: a connection's token, headers and
cookies are read again in the triggerer, never put in the trigger's arguments), once the triggerer's own policy
allows that cluster (``connection.endpoint``). The Jobs API client is synchronous: each look runs in a thread
(``asyncio.to_thread``), and so does the first import of ``ray``. A user who ends the deferred task (Airflow 3.3's
triggerer calls :meth:`RayJobTrigger.on_kill`) stops its job and deletes it: only a job whose metadata names that
very task instance and this deployment (a trigger's arguments are a task's to write).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

_ENDED = ("SUCCEEDED", "FAILED", "STOPPED")


class RayJobTrigger(BaseTrigger):
    """Fire when the job ended (``ended``), is gone (``missing``), waited too long (``pending``), or at ``deadline``.

    :param submission_id: the task's job
    :param cluster: ``{"ray_conn_id": ..., "address": ...}``, as the task's options name the cluster
    :param poll_interval: seconds between two looks (``[gpu] poll_interval``)
    :param deadline: when the task times out (seconds since the epoch), or ``None``
    :param pending_deadline: when a job still waiting for the cluster's resources counts as missing its GPUs
    :param state: what the task's resume needs (the ``Deferral``'s state), echoed in every event
    """

    def __init__(
        self,
        submission_id: str,
        cluster: dict[str, Any],
        poll_interval: float = 1.0,
        deadline: float | None = None,
        pending_deadline: float | None = None,
        *,
        state: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.submission_id = submission_id
        self.cluster = dict(cluster)
        self.poll_interval = poll_interval
        self.deadline = deadline
        self.pending_deadline = pending_deadline
        self.state = dict(state or {})

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """The classpath and the arguments the triggerer rebuilds the trigger from."""
        arguments = {
            "submission_id": self.submission_id,
            "cluster": self.cluster,
            "poll_interval": self.poll_interval,
            "deadline": self.deadline,
            "pending_deadline": self.pending_deadline,
            "state": self.state,
        }
        return f"{type(self).__module__}.{type(self).__qualname__}", arguments

    def _client(self) -> Any:
        from airflow_gpu_provider.backends.ray.connection import endpoint

        cluster = self.cluster
        return endpoint(cluster.get("ray_conn_id"), cluster.get("address"), owner="RayJobTrigger").jobs()

    def _event(self, status: str, **details: Any) -> TriggerEvent:
        payload = {"status": status, "submission_id": self.submission_id, **details}
        return TriggerEvent({**payload, "state": {"phase": "run", "backend": self.state}})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Look at the job every ``poll_interval`` seconds, in a thread, until it ends."""
        from airflow_gpu_provider.backends.ray.job import status

        client = await asyncio.to_thread(self._client)
        self.log.info("Watching Ray job %s every %ss until it ends", self.submission_id, self.poll_interval)
        while True:
            now = await asyncio.to_thread(status, client, self.submission_id)
            if now is None:
                yield self._event("missing")
                return
            if now in _ENDED:
                yield self._event("ended", job_status=now)
                return
            if self.deadline is not None and time.time() >= self.deadline:
                yield self._event("timeout")
                return
            if now == "PENDING" and self.pending_deadline is not None and time.time() >= self.pending_deadline:
                yield self._event("pending")
                return
            await asyncio.sleep(self.poll_interval)

    def _stop(self) -> None:
        from airflow_gpu_provider.backends.ray.durable import identity_of, mine
        from airflow_gpu_provider.backends.ray.job import delete, stop

        client, ti = self._client(), self.task_instance
        if ti is None or not mine(client.get_job_info(self.submission_id).metadata, identity_of(ti)):
            self.log.warning("Ray job %s is not this task instance's: it is left alone", self.submission_id)
            return
        stop(client, self.submission_id)
        delete(client, self.submission_id, self.log)

    async def on_kill(self) -> None:
        """A user ended the deferred task: stop its job and delete it."""
        self.log.warning("The task was ended by a user: stopping Ray job %s", self.submission_id)
        await asyncio.to_thread(self._stop)
