"""The backend interface: a pure ``plan(request)`` and an I/O ``run(plan)``.

Operators build a :class:`TaskRequest` and never look inside a backend; a backend only translates the request.
The registry of backends by name is :data:`airflow_gpu_provider.backends.BACKENDS`.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from airflow_gpu_provider.config import OnMissingGpu
from airflow_gpu_provider.exceptions import InvalidSettingError, RemoteTaskError, UnknownSettingError
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings


@dataclass(frozen=True)
class TaskRequest:
    """Everything a backend needs to run one task try, independent of the backend.

    :param envelope: the runtime envelope from :mod:`airflow_gpu_provider.payload` (the backend adds ``summary``)
    :param labels: identity of the task try (dag_id, task_id, run_id, try_number, map_index) for names and logs
    :param num_nodes: machines the envelope runs on at once (a multi-node launch); ``resources`` are per node
    """

    resources: ResourceSettings
    image: ImageSettings
    envelope: Mapping[str, Any]
    on_missing_gpu: OnMissingGpu = "fail"
    labels: Mapping[str, str] = field(default_factory=dict)
    num_nodes: int = 1

    def require_single_node(self, backend: str) -> None:
        """Raise for a multi-node request on a backend that runs on one machine."""
        if self.num_nodes > 1:
            raise InvalidSettingError(
                f"backend {backend!r}",
                "num_machines",
                self.num_nodes,
                f"{backend} runs a task on one machine",
                "num_machines=1, or backend='kubernetes'",
            )

    @property
    def display_name(self) -> str:
        """``dag.task`` (plus map index and try), for log lines and lock holders."""
        name = f"{self.labels.get('dag_id', '?')}.{self.labels.get('task_id', '?')}"
        if self.labels.get("map_index", "-1") not in ("-1", ""):
            name += f"[{self.labels['map_index']}]"
        return name


@dataclass(frozen=True)
class TaskResult:
    """What a finished run produced."""

    return_value: Any = None
    exit_code: int = 0


PlanT = TypeVar("PlanT")


class Backend(ABC, Generic[PlanT]):
    """Runs task requests somewhere. Subclasses set :attr:`name` and :attr:`option_names`."""

    name: ClassVar[str]
    option_names: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, options: Mapping[str, Any] | None = None, log: Any = None) -> None:
        self.validate_options(options or {})
        self.options = dict(options or {})
        self.log = log or logging.getLogger(f"airflow_gpu_provider.backends.{self.name}")

    @classmethod
    def validate_options(cls, options: Mapping[str, Any]) -> None:
        """Check ``backend_options`` at DAG parse time; unknown names are errors that list the known ones."""
        unknown = set(options) - cls.option_names
        if unknown:
            raise UnknownSettingError(f"backend {cls.name!r}", unknown, cls.option_names or ["(none)"])

    @classmethod
    def check_request(cls, options: Mapping[str, Any], resources: ResourceSettings, image: ImageSettings) -> None:
        """At DAG parse time, reject resources this backend cannot express (default: it can express all)."""

    @abstractmethod
    def plan(self, request: TaskRequest) -> PlanT:
        """Translate the request into this backend's spec. Pure: no I/O, no clients."""

    @abstractmethod
    def run(self, plan: PlanT) -> TaskResult:
        """Run the plan to completion, streaming logs; clean up whatever it started, on every path."""

    def kill(self) -> None:
        """Stop a running plan (called from the operator's ``on_kill``)."""


def result_value(result: Mapping[str, Any] | None, exit_code: int, *, where: str) -> Any:
    """Turn the runtime's result envelope and exit status into a return value or a :class:`RemoteTaskError`."""
    if result is not None and not result.get("ok", False):
        error = result.get("error") or {}
        raise RemoteTaskError(
            f"The task raised {error.get('type', 'an error')} in {where}: {error.get('message', '')}".rstrip(": ")
            + ". The traceback is in the log above.",
            error_type=error.get("type", ""),
            remote_traceback=error.get("traceback", ""),
        )
    if exit_code != 0:
        raise RemoteTaskError(f"The task process in {where} exited with status {exit_code}.")
    return None if result is None else result.get("return_value")
