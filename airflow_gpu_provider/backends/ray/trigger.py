"""The trigger a deferred Ray task waits on: it fires when the task's job has ended, by polling the Jobs API.

The decision loop and ``on_kill`` are the job wing's (``backends/jobs/trigger.py``); this trigger only looks at the
job (:meth:`RayJobTrigger.look`) and stops it (:meth:`RayJobTrigger.stop`). It reaches the cluster as the task did
(the connection's id or the address: a connection's token, headers and cookies are read again in the triggerer,
never put in the trigger's arguments), once the triggerer's own policy allows that cluster (``connection.endpoint``).
The Jobs API client is synchronous: each look runs in a thread, and so does the first import of ``ray``. A user who
ends the deferred task (Airflow 3.3's triggerer calls ``on_kill``) stops its job and deletes it: only a job whose
metadata names that very task instance and this deployment (a trigger's arguments are a task's to write).
"""

from __future__ import annotations

from typing import Any

from airflow.triggers.base import TriggerEvent

from airflow_gpu_provider.backends.jobs.trigger import JobTrigger, Look

_ENDED = ("SUCCEEDED", "FAILED", "STOPPED")


class RayJobTrigger(JobTrigger):
    """Fire when the job ended (``ended``), is gone (``missing``), waited too long (``pending``), or at ``deadline``.

    :param submission_id: the task's job
    :param cluster: ``{"ray_conn_id": ..., "address": ...}``, as the task's options name the cluster
    :param poll_interval: seconds between two looks (``[gpu] poll_interval``)
    :param deadline: when the task times out (seconds since the epoch), or ``None``
    :param pending_deadline: when a job still waiting for the cluster's resources counts as missing its GPUs
    :param state: what the task's resume needs (the ``Deferral``'s state), echoed in every event
    """

    noun = "Ray job"

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
        super().__init__(submission_id, cluster, poll_interval, deadline, pending_deadline, state=state)
        self._looks: Any = None  # the client of the looks

    def arguments(self) -> dict[str, Any]:
        """The job and the cluster (the names a stored row of an earlier release has)."""
        return {
            "submission_id": self.job_id,
            "cluster": self.where,
            "poll_interval": self.poll_interval,
            "deadline": self.deadline,
            "pending_deadline": self.pending_deadline,
            "state": self.state,
        }

    def _client(self) -> Any:
        from airflow_gpu_provider.backends.ray.connection import endpoint

        cluster = self.where
        return endpoint(cluster.get("ray_conn_id"), cluster.get("address"), owner="RayJobTrigger").jobs()

    def event(self, status: str, **details: Any) -> TriggerEvent:
        """The event, naming the job as events of earlier releases did."""
        return super().event(status, submission_id=self.job_id, **details)

    def look(self) -> Look:
        """The job's status (in a thread: the Jobs API client and its import block)."""
        from airflow_gpu_provider.backends.ray.job import status

        if self._looks is None:
            self._looks = self._client()
        now = status(self._looks, self.job_id)
        if now is None:
            return Look("missing")
        if now in _ENDED:
            return Look("ended", details={"job_status": now})
        return Look(pending=now == "PENDING")

    def stop(self) -> None:
        """Stop and delete the job, when it is this task instance's (in a thread)."""
        from airflow_gpu_provider.backends.ray.durable import identity_of, mine
        from airflow_gpu_provider.backends.ray.job import delete, stop

        client, ti = self._client(), self.task_instance
        if ti is None or not mine(client.get_job_info(self.job_id).metadata, identity_of(ti)):
            self.log.warning("Ray job %s is not this task instance's: it is left alone", self.job_id)
            return
        stop(client, self.job_id)
        delete(client, self.job_id, self.log)
