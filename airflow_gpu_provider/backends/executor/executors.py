"""Which executor of ``[core] executor`` runs a GPU task of the executor backend, and its queue (Celery, Edge)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.settings import ResourceSettings

Kind = Literal["local", "celery", "edge", "kubernetes"]
#: Executor class name -> what the provider gives it (local: nothing, one machine runs every task).
KINDS: dict[str, Kind] = {
    "LocalExecutor": "local",
    "CeleryExecutor": "celery",
    "EdgeExecutor": "edge",
    "KubernetesExecutor": "kubernetes",
}
QUEUE = re.compile(r"^[A-Za-z0-9_.\-]+$")
ANY_MODEL = "any"  # {accelerator} of a GPU task that names no model: any GPU worker may take it


@dataclass(frozen=True)
class Executor:
    """One entry of ``[core] executor``: ``LocalExecutor``, ``my.module.MyExecutor`` or ``alias:my.module.MyExecutor``.

    :param kind: what the provider places for it; ``None`` when it cannot place tasks there
    """

    alias: str | None
    path: str

    @property
    def name(self) -> str:
        """How a task names it (``BaseOperator(executor=...)``): its alias, else its name or path as configured."""
        return self.alias or self.path

    @property
    def class_name(self) -> str:
        """The executor's class name."""
        return self.path.rpartition(".")[2]

    @property
    def kind(self) -> Kind | None:
        """What the provider places for it."""
        return KINDS.get(self.class_name)

    def answers_to(self, name: str) -> bool:
        """Whether ``name`` (a task's ``executor`` or ``[gpu] executor``) means this executor."""
        return name in (self.alias, self.path, self.class_name)


def configured(value: str) -> list[Executor]:
    """The executors of ``[core] executor`` (the first is the default)."""
    found = []
    for entry in (part.strip() for part in value.split(",")):
        if entry:
            alias, _, path = entry.rpartition(":")
            found.append(Executor(alias or None, path))
    return found


def core_executors() -> list[Executor]:
    """``[core] executor`` of this deployment (read where the DAG is parsed)."""
    from airflow_gpu_provider.config import airflow_setting

    return configured(airflow_setting("core", "executor") or "LocalExecutor") or configured("LocalExecutor")


def chosen(owner: str, requested: str | None, executors: list[Executor]) -> Executor:
    """The executor a GPU task goes to: ``requested`` (the task's, the option's or ``[gpu] executor``) or the default.

    An executor that is not configured, or that the provider cannot place tasks on, is an error at parse.
    """
    names = ", ".join(repr(e.name) for e in executors)
    executor = executors[0] if not requested else next((e for e in executors if e.answers_to(requested)), None)
    if executor is None:
        raise InvalidSettingError(
            owner, "executor", requested, f"not an executor of [core] executor ({names})", f"one of {names}"
        )
    if executor.kind is None:
        raise InvalidSettingError(
            owner,
            "backend",
            "executor",
            f"the executor backend cannot place tasks on {executor.name!r}: it knows " + ", ".join(KINDS),
            "one of those executors ([gpu] executor, or the task's executor=...), or the local, docker or "
            "kubernetes backend",
        )
    return executor


def queue_for(owner: str, resources: ResourceSettings, template: str) -> str:
    """The queue of a GPU task: ``template`` with ``{accelerator}`` filled (:func:`model_slug`: ``gpu-a100``)."""
    queue = template.replace("{accelerator}", model_slug(owner, resources)) if "{accelerator}" in template else template
    if not QUEUE.fullmatch(queue):
        raise InvalidSettingError(
            owner, "queue", template, "not a queue name", "letters, digits, '-', '_' and '.', plus {accelerator}"
        )
    return queue


def model_slug(owner: str, resources: ResourceSettings) -> str:
    """``{accelerator}`` of queue and pool names: the model in lower case, or ``any`` for a task that names none.

    A fallback list has no one worker class: refused, since its first model's queue or pool would ignore the others.
    """
    if len(resources.accelerators) > 1:
        raise InvalidSettingError(
            owner, "accelerator", list(resources.accelerators),
            "a list of models has no one worker class for the {accelerator} of [gpu] queue or [gpu] pool",
            "one model, or a [gpu] queue and [gpu] pool without {accelerator}",
        )  # fmt: skip
    return slug(resources.accelerator) if resources.accelerator else ANY_MODEL


def slug(model: str) -> str:
    """An accelerator model as it appears in queue and pool names: ``A100-80GB`` -> ``a100-80gb``."""
    return re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")
