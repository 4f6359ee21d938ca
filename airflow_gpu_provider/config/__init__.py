"""The ``[gpu]`` and ``[gpu_policy]`` sections: their tables (:mod:`.options`, :mod:`.policy`), read as Airflow does.

Every option can be set in ``airflow.cfg`` or as ``AIRFLOW__GPU__<NAME>`` (``AIRFLOW__GPU_POLICY__<NAME>``).
:func:`get` reads one ``[gpu]`` option (cheap enough for every operator built while a DAG is parsed);
:func:`policy_values` the whole ``[gpu_policy]`` section; :class:`~.worker.GpuConfig` is all of them, read once when
a task starts and handed to the backend's ``plan()``, which reads no configuration itself.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, NamedTuple

from airflow_gpu_provider.config import options, policy
from airflow_gpu_provider.config.options import SECTION, Option

OPTIONS: tuple[Option, ...] = options.OPTIONS
POSITIVE_SECONDS = ("poll_interval", "wait_timeout", "kill_grace")
# Each NVML call of a sample takes the driver's lock, which the task's own CUDA calls on that GPU wait for: below
# this, telemetry could slow the task it measures (docs/telemetry.md)
MIN_PROFILE_INTERVAL = 0.25

__all__ = [
    "OPTIONS",
    "SECTION",
    "Option",
    "airflow_setting",
    "check_choice",
    "default_deferrable",
    "deprecated",
    "get",
    "policy_typed",
    "policy_values",
    "provider_config",
]


class Moved(NamedTuple):
    """Where a removed ``[gpu]`` option went: read for one more release, with a warning naming ``replacement``."""

    replacement: str
    #: the ``[gpu]`` option whose value it gives while that one is unset (or at its default); ``None``: read where
    #: the replacement is (:func:`deprecated`)
    option: str | None = None
    #: the old text in the new option's form (``None``: no effect there)
    value: Callable[[str], str | None] = str


def _off_when_false(text: str) -> str | None:
    """``[gpu] profile``'s text as ``profile_interval``: ``0`` when false; true changes nothing."""
    return None if _typed(Option("profile", "boolean", "True", ""), text) else "0"


#: The ``[gpu]`` options removed in 0.2.0 (issue 37), each one entry.
MOVED: dict[str, Moved] = {
    "wait_poll_interval": Moved("[gpu] poll_interval", "poll_interval"),
    "trigger_poll_interval": Moved("[gpu] poll_interval", "poll_interval"),
    "profile": Moved("[gpu] profile_interval = 0 (off)", "profile_interval", _off_when_false),
    "kubernetes_gpu_allocation": Moved("the Kubernetes connection's extra gpu_allocation"),
    "image_registry": Moved("the Docker connection's extra image_registry"),
    "ca_bundle": Moved("the Docker connection's extra ca_bundle"),
    "kueue_queue": Moved("the Kubernetes connection's extra kueue_queue"),
    "default_parent_image": Moved("the Docker or Kubernetes connection's extra parent_image"),
    "shm_size": Moved("the Docker connection's extra shm_size"),
}

_BY_NAME = {option.name: option for option in OPTIONS}
_VARIABLES = {option.name: f"AIRFLOW__{SECTION.upper()}__{option.name.upper()}" for option in OPTIONS}


def provider_config() -> dict[str, Any]:
    """The ``config`` entry of ``get_provider_info()``: ``[gpu]`` and ``[gpu_policy]``."""

    def described(table: tuple[Option, ...], added: str) -> dict[str, Any]:
        return {
            o.name: {"description": o.description, "version_added": added, "type": o.type, "example": o.example,
                     "default": o.default}
            for o in table
        }  # fmt: skip

    return {
        SECTION: {
            "description": "GPU tasks: default backend, GPU inventory and pool, images and requirements.",
            "options": described(OPTIONS, "0.1.0"),
        },
        policy.SECTION: {
            "description": "The admin's allow-lists: what of a host a DAG author's task may get (default deny).",
            "options": described(policy.POLICY_OPTIONS, "0.2.0"),
        },
    }


def _conf() -> Any:
    try:
        from airflow.sdk.configuration import conf
    except ImportError:  # pragma: no cover - Airflow 3.0 has it only in core
        from airflow.configuration import conf
    return conf


def airflow_setting(section: str, key: str, fallback: str | None = None) -> str | None:
    """An option of another section (``[core] executor``), as Airflow reads it: environment first."""
    return _conf().get(section, key, fallback=fallback)  # type: ignore[no-any-return]


def _typed(option: Option, text: str, section: str = SECTION) -> Any:
    if option.type == "boolean":
        lowered = text.strip().lower()
        if lowered not in ("t", "true", "1", "f", "false", "0"):
            raise ValueError(f"[{section}] {option.name}={text!r} is not a boolean (True or False)")
        return lowered in ("t", "true", "1")
    if option.type == "integer":
        return int(text)
    if option.type == "float":
        seconds = float(text)
        if option.name in POSITIVE_SECONDS and not 0 < seconds <= 10**9:  # NaN and infinity fail this too
            raise ValueError(f"[{SECTION}] {option.name}={text!r} is not a positive number of seconds (at most 1e9)")
        if option.name == "profile_interval" and not (seconds == 0 or MIN_PROFILE_INTERVAL <= seconds <= 10**9):
            raise ValueError(
                f"[{SECTION}] profile_interval={text!r} is below {MIN_PROFILE_INTERVAL} s: every sample takes the GPU "
                "driver's lock, which the task's own CUDA calls wait for (docs/telemetry.md). Accepted: 0.25 or more "
                "(at most 1e9), or 0 for no profile"
            )
        return seconds
    value = text.strip()
    if option.name == "state_dir" and not value:  # the default: in the worker user's own home
        value = f"{_home()}/.local/state/airflow-gpu-provider"
    if option.name == "state_dir" and (not value.startswith("/") or value.rstrip("/") == ""):
        raise ValueError(f"[{SECTION}] state_dir={text!r} must be an absolute folder other than '/'")
    if option.name == "cache_size":
        from airflow_gpu_provider.settings.units import parse_bytes

        try:
            parse_bytes(value)
        except ValueError:
            raise ValueError(f"[{SECTION}] {option.name}={text!r} is not an amount of bytes such as 50Gi") from None
    return value


def _home() -> str:
    """The home folder of this process's user, from its passwd entry (``$HOME`` only where it has none)."""
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_dir.rstrip("/")
    except KeyError:  # an arbitrary uid without an entry (OpenShift): the one clue left
        return os.environ.get("HOME", "").rstrip("/")


def get(name: str) -> Any:
    """Read one ``[gpu]`` option, typed.

    ``AIRFLOW__GPU__<NAME>`` first (as Airflow does), then airflow.cfg, then an old name of it (:data:`MOVED`, with a
    warning), then the documented default. Cheap enough for every operator built while a DAG is parsed.
    """
    option = _BY_NAME[name]
    text = _setting(SECTION, name)
    for old_name, moved in MOVED.items():
        old = deprecated(old_name) if moved.option == name and text in (None, option.default) else None
        text = text if old is None or moved.value(old) is None else moved.value(old)
    return _typed(option, option.default if text is None else text)


def deprecated(old_name: str) -> str | None:
    """A removed ``[gpu]`` option's text while it is still set (warning, naming its replacement), else ``None``."""
    text = _setting(SECTION, old_name)
    if text is not None:
        _deprecated(f"[{SECTION}] {old_name} is deprecated and read for one more release only: set "
                    f"{MOVED[old_name].replacement} instead")  # fmt: skip
    return text


@functools.cache
def _from_airflow_cfg(section: str, key: str) -> str | None:
    return airflow_setting(section, key)


def policy_values() -> dict[str, str]:
    """The ``[gpu_policy]`` section as this process sees it (:func:`.policy.read`, as the authorization plugin does).

    An old ``[gpu]`` name still set warns (``AirflowProviderDeprecationWarning``) naming its replacement.
    """
    return policy.read(_setting, _deprecated)


def policy_typed(name: str, text: str) -> Any:
    """A :func:`policy_values` value typed as its option says (``allow_unenforced_gpu_shares`` a bool; text else)."""
    return _typed(policy.option(name), text, policy.SECTION)


def _deprecated(message: str) -> None:
    import warnings

    from airflow.exceptions import AirflowProviderDeprecationWarning

    warnings.warn(message, AirflowProviderDeprecationWarning, stacklevel=3)


def _setting(section: str, key: str) -> str | None:
    """An option as Airflow reads it (``AIRFLOW__SECTION__KEY`` first), the file's value read once per process."""
    text = os.environ.get(f"AIRFLOW__{section.upper()}__{key.upper()}")
    return text if text is not None else _from_airflow_cfg(section, key)


def default_deferrable() -> tuple[bool, str | None]:
    """The default of a GPU task's ``deferrable``: Airflow's ``[operators] default_deferrable``, as every operator's.

    :returns: the default, and a deprecation notice while the dropped ``[gpu] deferrable`` is still set (it is read,
        and wins, for one release)
    """
    dropped = _setting(SECTION, "deferrable")
    if dropped is not None:
        notice = (
            f"[{SECTION}] deferrable={dropped!r} is deprecated and is read for one more release only: set Airflow's "
            "[operators] default_deferrable instead, the default of every operator's deferrable="
        )
        return _typed(_DEFERRABLE, dropped), notice
    return _typed(_DEFERRABLE, _setting("operators", "default_deferrable") or "False"), None


_DEFERRABLE = Option("deferrable", "boolean", "False", "deferrable's default, read as a boolean option is")


def check_choice(owner: str, field: str, value: object, choices: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``choices``; otherwise raise an error naming all three."""
    from airflow_gpu_provider.exceptions import InvalidSettingError

    if value not in choices:
        raise InvalidSettingError(owner, field, value, "unknown value", " or ".join(map(repr, choices)))
    return str(value)
