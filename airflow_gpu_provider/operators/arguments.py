"""The operators' arguments: resource shortcuts, templates kept for later, a command's argument list."""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_gpu_provider.exceptions import InvalidSettingError
from airflow_gpu_provider.settings import ResourceSettings
from airflow_gpu_provider.settings.escalation import OomEscalation

RESOURCE_SHORTCUTS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ResourceSettings))


def is_template(value: object) -> bool:
    """Whether a value is a Jinja template to be rendered when the task runs."""
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def resolve_resources(
    resources: ResourceSettings | None, shortcuts: Mapping[str, Any], *, owner: str
) -> tuple[ResourceSettings, dict[str, Any]]:
    """Apply the resource shortcuts to ``resources``: templated ones are returned apart, to apply when rendered.

    Settings are validated when they change only: ``resources`` alone comes back as it is.
    """
    if resources is not None and not isinstance(resources, ResourceSettings):
        raise InvalidSettingError(owner, "resources", resources, "expected a ResourceSettings", None)
    given = {k: v for k, v in shortcuts.items() if v is not None}
    overrides = {k: v for k, v in given.items() if is_template(v)}
    concrete = {k: v for k, v in given.items() if k not in overrides}
    settings = resources or ResourceSettings()
    return (settings.with_overrides(**concrete) if concrete else settings), overrides


def argv(command: Sequence[str] | str) -> list[str]:
    """A command as an argument list: a string is split with ``shlex`` (never a shell)."""
    return shlex.split(command) if isinstance(command, str) else list(command)


def check_on_oom(owner: str, on_oom: object, resources: ResourceSettings | None) -> OomEscalation | None:
    """``on_oom`` at DAG parse: an :class:`OomEscalation` that leads somewhere from the task's resources."""
    if on_oom is None:
        return None
    if not isinstance(on_oom, OomEscalation):
        raise InvalidSettingError(
            owner, "on_oom", on_oom, "expected an OomEscalation", "OomEscalation(accelerators=['L4', 'A100-80GB'])"
        )
    if resources is not None:  # templated resources are checked when rendered
        on_oom.check(resources, owner=owner)
    return on_oom
