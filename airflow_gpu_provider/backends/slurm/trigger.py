"""The trigger deferred Slurm tasks wait on: one query per cluster per poll, whatever the number of tasks.

One ``squeue`` per job and poll overloads a busy controller. This trigger declares Airflow's shared stream
(``BaseEventTrigger.shared_stream_key``, Airflow 3.3): the triggerer runs one poll loop per cluster and poll
interval (:meth:`SlurmJobTrigger.open_shared_stream`: every job of the connection's user, one ``squeue --json
--me`` or one ``GET /jobs``) and hands each snapshot to every trigger of the group, which picks its own job out of
it (:meth:`~SlurmJobTrigger.filter_shared_stream`) and decides with the job wing's loop (``jobs/trigger.py``). Run
alone (``dag.test()``, or an Airflow without shared streams) it opens a stream of its own. It reaches only a
connection the triggerer's own ``[gpu_policy] allowed_clusters`` allows, and watches or cancels only its own task
instance's job (the job's comment, ``orphans.mine``): another fires ``refused``. The client is
synchronous: each query runs in a thread. A pending job's new reason is logged once; a user who ends the deferred
task cancels its job (``on_kill``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable
from typing import Any

from airflow.triggers.base import TriggerEvent

from airflow_gpu_provider.backends.jobs.trigger import JobTrigger, Look
from airflow_gpu_provider.backends.slurm.orphans import mine
from airflow_gpu_provider.backends.slurm.states import JobInfo, pending_reason


def _client(conn_id: str) -> Any:
    """The cluster's client, once the triggerer's own ``[gpu_policy] allowed_clusters`` lets a trigger row reach it."""
    from airflow_gpu_provider.backends.slurm.clients import connect
    from airflow_gpu_provider.policy import Policy
    from airflow_gpu_provider.policy.slurm import check_cluster

    check_cluster("SlurmJobTrigger", conn_id, Policy.current())
    return connect(conn_id)


class SlurmJobTrigger(JobTrigger):
    """Fire when the job ended (``ended``), is gone (``missing``), waited too long (``pending``) or at ``deadline``.

    :param job_id: the task's job
    :param where: ``{"slurm_conn_id": ...}``: the connection is read again in the triggerer (its token too)
    """

    noun = "Slurm job"

    def __init__(self, job_id: str, where: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        super().__init__(job_id, where, *args, **kwargs)
        self._reason = ""

    def shared_stream_key(self) -> Hashable:
        """One poll loop per cluster and poll interval."""
        return ("airflow_gpu_provider.slurm", str(self.where.get("slurm_conn_id")), self.poll_interval)

    @classmethod
    async def open_shared_stream(cls, kwargs: dict[str, Any]) -> AsyncIterator[Any]:
        """Every job of the cluster's user (one query), every ``poll_interval`` seconds, for ever."""
        client = await asyncio.to_thread(_client, str(kwargs["where"]["slurm_conn_id"]))
        while True:
            yield await asyncio.to_thread(client.jobs)
            await asyncio.sleep(float(kwargs.get("poll_interval") or 1.0))

    def _look(self, jobs: dict[str, JobInfo]) -> Look:
        info = jobs.get(self.job_id)
        if info is None:
            return Look("missing")
        if not mine(info.comment, self._identity()):
            self.log.error("Slurm job %s is not this task's: nothing is watched", self.job_id)
            return Look("refused")
        if not info.active:
            return Look("ended", details={"job_state": info.state})
        if info.state == "PENDING" and info.reason != self._reason and info.reason not in ("", "None"):
            self._reason = info.reason
            self.log.info("Slurm job %s %s", self.job_id, pending_reason(info.reason))
        return Look(pending=info.state == "PENDING")

    async def _looks(self, snapshots: AsyncIterator[Any]) -> AsyncIterator[Look]:
        async for jobs in snapshots:
            yield self._look(jobs)

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        """The event of this trigger's job, from the group's snapshots."""
        async for event in self.watch(self._looks(shared_stream)):
            yield event

    async def looks(self) -> AsyncIterator[Look]:
        """Alone: a stream of its own."""
        async for look in self._looks(self.open_shared_stream(self.arguments())):
            yield look

    def _identity(self) -> dict[str, Any] | None:
        """The task instance the triggerer runs this trigger for (``None`` under ``dag.test()``)."""
        ti = self.task_instance
        if ti is None:
            return None
        return {key: getattr(ti, key, None) for key in ("dag_id", "task_id", "run_id")} | {
            "map_index": getattr(ti, "map_index", -1)
        }

    def stop(self) -> None:
        """Cancel the job (SIGTERM, then SIGKILL: ``scancel``), when it is this task's."""
        client = _client(str(self.where["slurm_conn_id"]))
        info = client.job(self.job_id)
        if info is not None and mine(info.comment, self._identity()):
            client.cancel(self.job_id)
