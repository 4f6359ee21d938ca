"""The backend interface: a pure ``plan(request)`` and an I/O ``run(plan, context)``.

Operators build a :class:`~airflow_gpu_provider.task.request.TaskRequest` and never look inside a backend; a
backend only translates the request, with the worker's ``[gpu]`` options (:class:`~.config.worker.GpuConfig`) that
the operator read once. The registry of backends by name is :mod:`airflow_gpu_provider.backends`.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from airflow_gpu_provider.backends.options import BackendOptions
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
        """Start the plan and leave it running (``deferrable=True``).

        A :class:`Deferral`, or a result when it is over already. Only backends whose registry entry says ``defers``
        implement it.
        """
        raise NotImplementedError(f"the {self.name!r} backend cannot defer a running task")

    def resume(self, plan: PlanT, state: dict[str, Any], event: Any, context: Context) -> TaskResult | Deferral:
        """On a worker again, after the trigger fired: collect what :meth:`start` left running and clean up.

        Or defer again. ``plan`` is the same try's plan, made anew; ``state`` is the :class:`Deferral`'s.
        """
        raise NotImplementedError(f"the {self.name!r} backend cannot defer a running task")

    def kill(self) -> None:
        """Stop a running plan (called from the operator's ``on_kill``)."""

    def render(self, request: TaskRequest, conf: GpuConfig, context: Context) -> list[dict[str, Any]]:
        """What :meth:`run` would submit, as API dicts (for backends whose registry entry says ``renders``)."""
        raise NotImplementedError(f"the {self.name!r} backend cannot render what it would run")
