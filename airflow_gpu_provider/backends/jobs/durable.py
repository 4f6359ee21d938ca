"""A job's record in its task instance's task state store: what a later try takes over.

Airflow 3.3's task state store (AIP-103) survives a task instance's retries. A backend records its job there as
soon as the job exists (:meth:`JobRecord.record`: its id, where it runs, and the try that follows it); the next try
of the same task instance (its worker killed, a redeploy, a deferral's resume) finds it (:meth:`JobRecord.recorded`)
and follows, collects or removes that job instead of starting a second one. A try stops and removes its job only
while it still :meth:`~JobRecord.owns` it, and :meth:`~JobRecord.forget` s it once it is gone. A record is data a try
wrote: each backend checks the job itself too (its labels, metadata or comment name the task instance) before it
takes it over. Without a task state store (Airflow < 3.3) nothing is recorded and every try starts afresh.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _any_id(value: str) -> bool:
    return bool(value)


@dataclass(frozen=True)
class JobRecord:
    """How one backend records its jobs.

    :param key: the task state store key (renaming it orphans the records of tries under way)
    :param noun: what the job is called in the log ("container", "Slurm job")
    :param where: the record's field that names where the job runs (the engine, the cluster)
    :param valid_id: whether a recorded id has the form this backend's ids have (anything else is ignored)
    """

    key: str
    noun: str
    where: str
    valid_id: Callable[[str], bool] = _any_id

    def entry(self, job_id: str, where: str, try_number: str, **extra: Any) -> dict[str, Any]:
        """What the store keeps of a job: its id, where it runs, the try that follows it (and the backend's own)."""
        return {"id": job_id, self.where: where, "try": try_number, **extra}

    def record(self, state_store: Any, job_id: str, where: str, try_number: str, **extra: Any) -> None:
        """Keep the job of this try for the next one (nothing without a task state store)."""
        if state_store is not None:
            state_store.set(self.key, self.entry(job_id, where, try_number, **extra))

    def forget(self, state_store: Any, job_id: str | None = None) -> None:
        """The job was removed (or collected): nothing to take over.

        :param job_id: forget the record only while it names this job (not one submitted since, by the same try)
        """
        if state_store is None:
            return
        value = None if job_id is None else state_store.get(self.key, default=None)
        if job_id is None or (isinstance(value, dict) and value.get("id") == job_id):
            state_store.delete(self.key)

    def recorded(self, state_store: Any, where: str) -> dict[str, Any] | None:
        """The record an earlier try of this task instance left for a job ``where``, or ``None``."""
        return None if state_store is None else self.checked(state_store.get(self.key, default=None), where)

    def checked(self, value: Any, where: str) -> dict[str, Any] | None:
        """A stored value when it is a record of this form for a job ``where``; ``None`` for anything else."""
        if not isinstance(value, dict) or value.get(self.where) != where:
            return None
        job_id = value.get("id")
        return dict(value) if isinstance(job_id, str) and self.valid_id(job_id) else None

    def owns(self, state_store: Any, job_id: str, try_number: str, log: logging.Logger) -> bool:
        """Whether this try may still stop and remove its job: no later try took it over (:meth:`record` again).

        A try whose worker was killed can live on (Airflow's task process leads a process group of its own, which a
        worker's ``killpg`` misses) and reach its clean-up while a later try follows the same job. Without an answer
        from the store (its supervisor died with the worker) the job is not removed on a guess: the orphan reaper
        removes it once its task instance has ended.
        """
        if state_store is None:
            return True
        try:
            value = state_store.get(self.key, default=None)
        except Exception as err:  # noqa: BLE001 - the store is out of reach: this try's supervisor is gone
            log.warning("Cannot tell whether a later try took %s %s over (%s): it is kept.", self.noun, job_id, err)
            return False
        if isinstance(value, dict) and value.get("id") == job_id and value.get("try") != try_number:
            log.warning(
                "%s %s was taken over by try %s of this task: it is left to that try.",
                self.noun[:1].upper() + self.noun[1:],
                job_id,
                value.get("try"),
            )
            return False
        return True
