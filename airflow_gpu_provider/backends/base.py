"""The backend interface: a pure ``plan(request)`` and an I/O ``run(plan, context)``.

Operators build a :class:`~airflow_gpu_provider.task.request.TaskRequest` and never look inside a backend; a
backend only translates the request, with the worker's ``[gpu]`` options (:class:`~.config.worker.GpuConfig`) that
the operator read once. The registry of backends by name is :mod:`airflow_gpu_provider.backends`. A backend whose
run is one job outside the worker that a later try can reconnect to is a :class:`ResumableBackend`: the operator
runs it through Airflow's own durable contract (``ResumableJobMixin``, ``operators/durable.py``).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from airflow_gpu_provider.backends.options import BackendOptions, BadOption
from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.task.request import TaskRequest
from airflow_gpu_provider.task.result import TaskResult

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_gpu_provider.config.worker import GpuConfig

OptionsT = TypeVar("OptionsT", bound=BackendOptions)
PlanT = TypeVar("PlanT")


@dataclass(frozen=True)
class Deferral:
    """A job started and left running while the task is deferred (``deferrable=True``).

    :param trigger: the trigger that waits for it in the triggerer (an Airflow ``BaseTrigger``)
    :param state: JSON that :meth:`Backend.resume` gets back, with the trigger's event, on the worker
    :param timeout: how long the deferral may last (``None``: the task's ``execution_timeout`` alone)
    """

    trigger: Any
    state: dict[str, Any] = field(default_factory=dict)
    timeout: timedelta | None = None


class Backend(ABC, Generic[OptionsT, PlanT]):
    """Runs task requests somewhere.

    :param options: the backend's parsed ``backend_options``
    """

    name: ClassVar[str]

    def __init__(self, options: OptionsT, log: Any = None) -> None:
        self.options = options
        self.log = log or logging.getLogger(f"airflow_gpu_provider.backends.{self.name}")

    @abstractmethod
    def plan(self, request: TaskRequest, conf: GpuConfig) -> PlanT:
        """Translate the request into this backend's spec. Pure: no I/O, no clients, no configuration read.

        :param conf: the worker's ``[gpu]`` options, read once when the try started
        """

    @abstractmethod
    def run(self, plan: PlanT, context: Context) -> TaskResult:
        """Run the plan to completion in the task's context, streaming logs; clean up on every path."""

    def start(self, plan: PlanT, context: Context) -> TaskResult | Deferral:
        """Start the plan and leave it running (``deferrable=True``): a :class:`Deferral`, or a result.

        Only backends whose registry entry says ``defers`` implement it.
        """
        raise NotImplementedError(f"the {self.name!r} backend cannot defer a running task")

    def resume(self, plan: PlanT, state: dict[str, Any], event: Any, context: Context) -> TaskResult | Deferral:
        """On a worker again, after the trigger fired: collect what :meth:`start` left, clean up (or defer again).

        ``plan`` is the same try's plan, made anew; ``state`` is the :class:`Deferral`'s.
        """
        raise NotImplementedError(f"the {self.name!r} backend cannot defer a running task")

    def kill(self) -> None:
        """Stop a running plan (called from the operator's ``on_kill``)."""

    def render(self, request: TaskRequest, conf: GpuConfig, context: Context) -> list[dict[str, Any]]:
        """What :meth:`run` would submit, as API dicts (for backends whose registry entry says ``renders``)."""
        raise NotImplementedError(f"the {self.name!r} backend cannot render what it would run")


class ResumableBackend(Backend[OptionsT, PlanT]):
    """A backend whose synchronous run is one job a later try of the task instance can reconnect to.

    Airflow 3.3's durable contract (``ResumableJobMixin.execute_resumable``: ``operators/durable.py``) drives it:
    the job's record (JSON, :meth:`submit`'s) is kept in the task instance's task state store under
    :attr:`state_key`; a later try asks :meth:`job_status` of the recorded job and follows an active one
    (:meth:`follow`), collects a succeeded one (:meth:`job_result`), or submits afresh (a failed or vanished job).
    ``durable=False`` submits and follows, recording nothing.
    """

    #: the task state store key of the job's record (renaming it orphans the records of tries under way)
    state_key: ClassVar[str]

    def run(self, plan: PlanT, context: Context) -> TaskResult:
        """Submit the job and follow it to its end (a run that no later try reconnects to)."""
        return self.follow(plan, self.submit(plan, context), context)

    @abstractmethod
    def submit(self, plan: PlanT, context: Context) -> dict[str, Any]:
        """Start the job (removing what an earlier try of the task instance left); its record, kept for later tries."""

    @abstractmethod
    def job_status(self, plan: PlanT, record: Any, context: Context) -> str:
        """The recorded job's status in the backend's words (``"missing"`` when it is gone or is not this task's)."""

    @abstractmethod
    def job_active(self, status: str) -> bool:
        """Whether a job of this status still runs: a later try follows it instead of starting another."""

    @abstractmethod
    def job_succeeded(self, status: str) -> bool:
        """Whether a job of this status ended well: a later try collects its result."""

    @abstractmethod
    def follow(self, plan: PlanT, record: Any, context: Context) -> TaskResult:
        """Follow the job to its end, log its output, read its result, clean up (unless a later try took it over)."""

    def job_result(self, plan: PlanT, record: Any, context: Context) -> TaskResult:
        """The result of a job that ended well, which an earlier try started: as :meth:`follow` collects it."""
        return self.follow(plan, record, context)


def connection_extra(
    connection: str,
    extras: Mapping[str, Any],
    name: str,
    old_option: str | None,
    *,
    accepted: str,
    check: Callable[[str], object],
) -> str | None:
    """An engine's or cluster's fact: the extra ``name`` of ``connection`` (its extras ``extras``), checked.

    Unset, the removed ``[gpu] <old_option>`` gives it for one more release (warning, naming the extra); else ``None``.

    :param check: refuses a value by raising ``BadOption`` or ``ValueError`` (its reason in the error)
    :raises InvalidSettingError: naming the connection (or the option), the field, the value and ``accepted``
    """
    from airflow_gpu_provider import config

    owner, field, value = connection, f"extra {name}", extras.get(name)
    if value in (None, "") and old_option is not None:
        owner, field, value = "[gpu]", old_option, config.deprecated(old_option)
    if value in (None, ""):
        return None
    try:
        if not isinstance(value, str):
            raise BadOption("not a string")
        check(value.strip())
    except (BadOption, ValueError) as err:
        reason = err.reason if isinstance(err, BadOption) else str(err)
        raise InvalidSettingError(owner, field, value, reason, accepted) from None
    return value.strip()
