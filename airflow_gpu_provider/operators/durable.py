"""``durable=True`` in Airflow's words: every GPU operator is a ``ResumableJobMixin`` (Airflow 3.3's durable contract).

A try whose backend runs one job outside the worker that a later try can reconnect to (a
:class:`~airflow_gpu_provider.backends.base.ResumableBackend`: the Docker backend's synchronous run) runs through
Airflow's own ``execute_resumable``: the job's record goes to the task instance's task state store under the
backend's key, and the next try of the task instance (its worker killed, a redeploy) reconnects to a job that still
runs, collects one that ended well, or submits afresh; Airflow counts each decision in its metrics
(``resumable_job.*``) and traces it. The methods below only hand Airflow's calls to the try's backend.

Airflow 3.1 and 3.2 have no task state store: ``airflow.providers.common.compat`` gives a stand-in mixin that submits
and follows the job on every try. A deferred try is durable by its own means (its trigger and the same record), and
KubernetesPodOperator, which runs a Kubernetes task, is durable by its own ``durable=``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.providers.common.compat.sdk import ResumableJobMixin  # airflow.sdk's from 3.3, else a stand-in

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_gpu_provider.backends.base import ResumableBackend
    from airflow_gpu_provider.task.result import TaskResult


class DurableJob(ResumableJobMixin):
    """Airflow's ``submit_job`` / ``get_job_status`` / ``poll_until_complete`` ... of a GPU try, handed to its backend.

    ``execute`` sets :attr:`_job` (the try's backend and plan) before it calls ``execute_resumable``.
    """

    durable: bool  # a later try takes over the job an earlier try left running (set from the settled task)
    _job: tuple[ResumableBackend[Any, Any], Any] | None = None
    _job_result: TaskResult | None = None

    def _resumable(self) -> tuple[ResumableBackend[Any, Any], Any]:
        assert self._job is not None, "execute() sets the try's backend before execute_resumable()"
        return self._job

    def submit_job(self, context: Context) -> Any:
        """Start the try's job; its record (JSON), which Airflow keeps in the task state store."""
        backend, plan = self._resumable()
        self._job_result = None
        return backend.submit(plan, context)

    def get_job_status(self, external_id: Any, context: Context) -> str:
        """The status of the job an earlier try recorded, in the backend's words."""
        backend, plan = self._resumable()
        return backend.job_status(plan, external_id, context)

    def is_job_active(self, status: str) -> bool:
        """The recorded job still runs: this try follows it."""
        return self._resumable()[0].job_active(status)

    def is_job_succeeded(self, status: str) -> bool:
        """The recorded job ended well: this try collects its result."""
        return self._resumable()[0].job_succeeded(status)

    def poll_until_complete(self, external_id: Any, context: Context) -> Any:
        """Follow the job to its end; its result (Airflow 3.3 returns it as such when it reconnected)."""
        backend, plan = self._resumable()
        self._job_result = backend.follow(plan, external_id, context)
        return self._job_result

    def get_job_result(self, external_id: Any, context: Context) -> Any:
        """The result of the job this try followed, or of one an earlier try started that ended well."""
        result, self._job_result = self._job_result, None
        if result is not None:
            return result
        backend, plan = self._resumable()
        return backend.job_result(plan, external_id, context)
