"""``backend_options``: each backend's options as one typed, frozen dataclass, checked when the DAG is parsed.

A backend declares every option once, as a field made by :func:`option`: its default, and the check that turns a
given value into the typed value. ``None`` keeps the default; an unknown name or a bad value raises an error that
names the backend, the option, the value and the accepted forms. The checks below are shared by the backends.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from airflow_gpu_provider.exceptions import InvalidSettingError, UnknownSettingError
from airflow_gpu_provider.settings import ImageSettings, ResourceSettings

Check = Callable[[Any], Any]
OptionsT = TypeVar("OptionsT", bound="BackendOptions")
MAX_SECONDS = 10**9  # about 31 years: more is a unit mistake


class BadOption(ValueError):
    """Raised by a check; :meth:`BackendOptions.parse` turns it into an error naming backend and option.

    :param value: the offending part of the value (an item of a list), when not the whole value
    """

    def __init__(self, reason: str, accepted: str | None = None, *, value: object = dataclasses.MISSING) -> None:
        super().__init__(reason)
        self.reason, self.accepted, self.value = reason, accepted, value


def option(default: Any = None, *, check: Check) -> Any:
    """A field of a :class:`BackendOptions` dataclass: its default and its check."""
    if isinstance(default, (list, dict, set)):
        raise TypeError("use a tuple or None as the default of an option")  # pragma: no cover - a coding error
    return dataclasses.field(default=default, metadata={"check": check})


@dataclass(frozen=True)
class BackendOptions:
    """Base of every backend's options. Subclasses are frozen dataclasses whose fields come from :func:`option`."""

    backend: ClassVar[str]
    #: Options a task may no longer give, and why (what a DAG written for an older release is told).
    removed: ClassVar[Mapping[str, str]] = {
        "state_dir": "A task has no state dir of its own: GPU locks and caches are the host's ([gpu] state_dir)."
    }

    @classmethod
    def names(cls) -> frozenset[str]:
        """Every accepted option name."""
        return frozenset(f.name for f in dataclasses.fields(cls))

    @classmethod
    def parse(cls: type[OptionsT], options: Mapping[str, Any]) -> OptionsT:
        """Check names and values of ``backend_options``; return the typed options."""
        if not isinstance(options, Mapping):
            raise InvalidSettingError(
                f"backend {cls.backend!r}",
                "backend_options",
                options,
                "expected a mapping of option names to values",
                "a dict such as {'timeout': 30}",
            )
        unknown = {name for name in options if name not in cls.names()}
        if unknown:
            names = (name if isinstance(name, str) else repr(name) for name in unknown)  # sortable, as typed
            hint = " ".join(cls.removed[name] for name in sorted(unknown & cls.removed.keys()))
            raise UnknownSettingError(f"backend {cls.backend!r}", names, sorted(cls.names()) or ["(none)"], hint)
        checks = {f.name: f.metadata["check"] for f in dataclasses.fields(cls)}
        values = {}
        for name, value in options.items():
            if value is None:
                continue
            try:
                values[name] = checks[name](value)
            except BadOption as err:
                culprit = value if err.value is dataclasses.MISSING else err.value
                raise cls.invalid(name, culprit, err.reason, err.accepted) from None
        return cls(**values)

    @classmethod
    def invalid(cls, name: str, value: object, reason: str, accepted: str | None = None) -> InvalidSettingError:
        """An error for ``backend_options[name]``."""
        return InvalidSettingError(f"backend {cls.backend!r}", f"backend_options[{name!r}]", value, reason, accepted)

    def check(self, resources: ResourceSettings) -> None:
        """At DAG parse time, reject resources this backend cannot express with these options (default: none)."""

    def check_image(self, image: ImageSettings) -> None:
        """At DAG parse time, reject software settings this backend cannot honour safely (default: none)."""

    def permitted(self, owner: str) -> None:
        """At DAG parse time, refuse what these options ask of a host beyond the deployment's ``[gpu]`` allow-lists.

        (``policy/``; default: nothing to ask.) The worker checks the final object again before it submits it.
        """


# ---------------------------------------------------------------------------------------------- shared checks
def text(value: Any) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise BadOption("expected a non-empty string", "a string")
    return value


def boolean(value: Any) -> bool:
    """``True`` or ``False``."""
    if not isinstance(value, bool):
        raise BadOption("expected a boolean", "True or False")
    return value


def seconds(value: Any) -> float:
    """A positive number of seconds, up to :data:`MAX_SECONDS` (NaN and infinities are not durations)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_SECONDS:
        raise BadOption(f"expected a positive number of seconds, at most {MAX_SECONDS:.0e}", "e.g. 10 or 2.5")
    return float(value)


def one_of(*choices: str) -> Check:
    """One of ``choices``."""

    def check(value: Any) -> str:
        if value not in choices:
            raise BadOption("unknown value", " or ".join(map(repr, choices)))
        return str(value)

    return check


def dict_list(value: Any, *, keys: frozenset[str], what: str, accepted: str) -> tuple[dict[str, Any], ...]:
    """A list of dicts, each with only ``keys`` (mounts, tolerations, ...), copied."""
    if isinstance(value, (str, Mapping)) or not isinstance(value, Sequence):
        raise BadOption(f"expected a list of {what}s", accepted)
    for item in value:
        if not isinstance(item, Mapping) or set(item) - keys:
            raise BadOption(f"not a {what}", accepted, value=item)
    return tuple(dict(item) for item in value)


def string_list(value: Any) -> tuple[str, ...]:
    """A non-empty list of strings or integers, as strings."""
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise BadOption("expected a non-empty list", "a list such as ['0', '1']")
    for item in value:
        if not isinstance(item, (str, int)) or isinstance(item, bool) or not str(item).strip():
            raise BadOption("every item must be a non-empty string or integer", "strings or integers", value=item)
    return tuple(str(item) for item in value)


def _devices(value: object) -> str:
    accepted = "ids of the host's GPUs (of [gpu] devices, or NVML's indices or UUIDs) such as '0,1'"
    try:
        from airflow_gpu_provider.host.inventory import parse_devices  # only for tasks that list devices

        listed = parse_devices(text(value))
    except InvalidSettingError as err:
        raise BadOption(err.reason, accepted) from None
    if not listed or any(device.name for device in listed):
        raise BadOption("a task's devices only narrow the host's: list device ids, without models", accepted)
    return str(value)


@dataclass(frozen=True)
class WorkerOptions(BackendOptions):
    """Options of a backend whose task process runs on the worker host itself (local, executor).

    :param devices: which of the host's GPUs the task may take (ids of ``[gpu] devices``, or NVML's indices or
        UUIDs): it only narrows them, and still takes their locks and skips those quarantined
    :param kill_grace: seconds between SIGTERM and SIGKILL when the task is stopped (default ``[gpu] kill_grace``)
    """

    devices: str | None = option(check=_devices)
    kill_grace: float | None = option(check=seconds)

    @property
    def device_ids(self) -> tuple[str, ...]:
        """The ids of ``devices`` (none: any of the host's GPUs)."""
        return tuple(part.strip() for part in (self.devices or "").split(",") if part.strip())
